"""Strict fakes of the GCP and Azure REST APIs, shared by the spot, reaper and alarm suites
(see tests/README.md)."""
