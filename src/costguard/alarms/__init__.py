"""Day-one budget alarms, the live burn rate, and the launch guard.

* :mod:`costguard.alarms.spec` - pure: validate the request once, before any call.
* :mod:`costguard.alarms.plan` - pure: the plan values (:class:`~costguard.alarms.plan.ApiCall`,
  :class:`~costguard.alarms.plan.Plan`); :mod:`~costguard.alarms.plan_aws`,
  :mod:`~costguard.alarms.plan_gcp`, :mod:`~costguard.alarms.plan_azure` diff a spec
  against what exists and return the exact API calls.
* :mod:`costguard.alarms.aws`, :mod:`~costguard.alarms.gcp`, :mod:`~costguard.alarms.azure`
  - read what exists, execute a plan (the ``alarm`` entries of
  :data:`costguard.providers.ADAPTERS`; :mod:`costguard.alarms.backend` is their protocol).
* :mod:`costguard.alarms.burn` - running instances x list price = $/h now, and the month's
  projection (billing data lags hours; this does not).
* :mod:`costguard.alarms.guard` - ``require_alarm``: no budget, no launch.
"""
