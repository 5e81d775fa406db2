"""Shut idle GPUs down: ``costguard reap`` from cron, ``costguard agent`` on the instance.

* :mod:`costguard.reaper.policy` decides, purely: which instance is idle
  (:func:`~costguard.reaper.policy.judge_idle`) and what a run may do within its safety
  limits (:func:`~costguard.reaper.policy.plan_reap`).
* :mod:`costguard.reaper.fleet` is the thin loop that asks a cloud for instances and
  metrics, judges them and carries out the plan.
* :mod:`costguard.reaper.aws`, :mod:`~costguard.reaper.gcp`, :mod:`~costguard.reaper.azure`
  talk to each cloud in batches; :mod:`costguard.reaper.agent` is the on-instance autostop.
"""
