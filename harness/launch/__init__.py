"""Launching arms, in three floors (docs/internals/launch.md):

* ``ranks``: starting rank processes (the rank program ``rank_main``, its commands and
  environment, rendezvous ports, warm servers, emulated ranks, command cases, the repro line);
* what every backend shares: ``sweep_folder`` (what both backends do to a sweep folder: the
  manifest, the case folders, resuming, judging a case once), one protocol per seam
  (``sweep_backend.SweepBackend`` with the typed ``Collection``, ``arm_launcher.ArmLauncher``),
  ``pipeline`` (``run_to_end`` / ``finish``, the sinks), ``case_status``;
* the backends, side by side, neither importing the other: ``local`` (this machine: the
  backend, the run loop ``lanes``, ``launcher``, ``progress``, ``estimate``) and ``slurm``
  (submitit submission, the job's task, profiles, events, polling, status, wait, collect, retry).

A floor imports only floors below it (tests/test_layers.py). See docs/internals.md."""
