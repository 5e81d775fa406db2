"""``costguard pricing refresh``: rebuild the instance price tables from the providers'
official price APIs (or responses downloaded earlier), into the user cache.

* :mod:`~costguard.pricing.refresh.runner` checks a request, reads the providers side
  by side, merges and writes; one provider failing leaves the others refreshed.
* :mod:`~costguard.pricing.refresh.aws`, :mod:`~costguard.pricing.refresh.gcp`,
  :mod:`~costguard.pricing.refresh.azure` talk to the APIs (or read a mirror:
  :mod:`~costguard.pricing.refresh.mirror`), retrying throttling with backoff
  (:mod:`costguard.retry`).
* :mod:`~costguard.pricing.refresh.parse` (the rules every provider's records are read
  by) with one module per provider, ``parse_<cloud>.py`` (API records -> prices per
  table row), and
  :mod:`~costguard.pricing.refresh.merge` (fresh prices + tables in use -> new tables)
  decide, with no I/O.
* :mod:`~costguard.pricing.refresh.cache` writes the tables atomically.

Nothing here imports a cloud SDK at module load; each adapter imports its own when a
refresh of that provider runs.
"""
