"""Spot launcher and recovery controller (``costguard launch``).

``recovery`` decides where to run next from the job's history (pure); ``launcher``
holds one adapter per provider (``local``, ``aws``, ``gcp``, ``azure``) behind the
:class:`~costguard.spot.launcher.base.Launcher` base; ``job`` keeps the job's
state in the checkpoint store, so the controller itself is stateless.
"""
