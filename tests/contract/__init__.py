"""Contract suites: one behaviour, run against every implementation's fixture (fsspec's
``tests/abstract`` pattern; the Store's is tests/checkpoint/test_store_contract.py)."""
