"""Price tables and cost estimates.

* :mod:`costguard.pricing.catalog` loads the tables (bundled with the package, or a
  directory the user names) into plain dataclasses.
* :mod:`costguard.pricing.gpus` maps what people type (``a10g``, ``A100 80GB``) to the
  canonical accelerator names the tables use.
* :mod:`costguard.pricing.estimate` is the pure arithmetic: price x hours x count +
  storage + egress, per provider, region and market.
"""
