"""Launching arms: ``rank_main`` (the per-rank process), ``local`` (spawned ranks on this machine),
``sweep`` (cases x arms, resume, verdicts, reports), ``progress``, ``ports``, and the Slurm
launcher (``slurm``, ``slurm_job``, ``slurm_track``, ``profiles``). See docs/internals.md."""
