"""The local backend: a sweep's arms on this machine (``launch/local/``, beside ``launch/slurm/``).

* ``backend``: ``LocalBackend`` (the four verbs of ``launch.sweep_backend.SweepBackend``) and
  ``run_sweep`` (``dcp-harness run``);
* ``lanes``: the run loop (cases x arms, one or two lanes, resume, a verdict per case);
* ``launcher``: ``LocalLauncher``, an arm's rank processes on this machine
  (``python -m harness.launch.local`` runs one arm: the repro line's entry point);
* ``progress``: the live display of a run; ``estimate``: an arm's expected time here.
"""
