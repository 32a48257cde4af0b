"""Launching arms: ``rank_main`` (the per-rank process), ``local`` (spawned ranks on this machine),
``sweep`` (cases x arms, resume, verdicts, reports), ``progress``, ``ports``, and the Slurm
launcher (``slurm``, ``slurm_job``, ``slurm_poll``, ``slurm_status``, ``slurm_wait``,
``slurm_collect``, ``slurm_retry``, ``profiles``). See docs/internals.md."""
