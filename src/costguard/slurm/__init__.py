"""SLURM: preempt-safe batch jobs that save on the warning signal and requeue themselves.

:mod:`costguard.slurm.batch` decides (validates the request, writes the batch script
from the template in ``infra/slurm/``); :mod:`costguard.slurm.sbatch` submits it. The
cost of an allocation in service units lives with the other estimates, in
:mod:`costguard.pricing.estimate`.
"""
