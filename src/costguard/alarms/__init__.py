"""Day-one budget alarms, the live burn rate, and the launch guard.

* :mod:`costguard.alarms.plan` - pure: validate the request, diff against what exists,
  return the exact API calls.
* :mod:`costguard.alarms.aws`, :mod:`~costguard.alarms.gcp`, :mod:`~costguard.alarms.azure`
  - read what exists, execute a plan.
* :mod:`costguard.alarms.burn` - running instances x list price = $/h now, and the month's
  projection (billing data lags hours; this does not).
* :mod:`costguard.alarms.guard` - ``require_alarm``: no budget, no launch.
"""
