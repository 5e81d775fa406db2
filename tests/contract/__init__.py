"""Contract suites: one behaviour, run against every implementation's fixture (fsspec's
``tests/abstract`` pattern): Launcher, Fleet, alarm backend and Store."""
