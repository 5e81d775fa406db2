"""What was billed: spend per job, owner, project, day or service from the clouds' billing
exports (FOCUS 1.0, AWS CUR 2.0, the GCP BigQuery export saved as JSONL or Parquet).

:mod:`costguard.billing.spend` decides (which format a file is, which tag a key spells,
which period and currency a report covers); :mod:`costguard.billing.exports` reads the
files, local or in a bucket, with pyarrow (the ``billing`` extra), only the columns needed.
"""
