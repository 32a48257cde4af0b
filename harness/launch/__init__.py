"""Launching arms, in three floors (docs/internals/launch.md):

* ``ranks``: starting rank processes (the rank program ``rank_main``, its commands and
  environment, rendezvous ports, warm servers, emulated ranks, command cases, the repro line);
* the local backend and the sweep: ``launcher`` (the ``ArmLauncher`` interface), ``local``,
  ``sweep``, ``progress``, ``estimate``, ``datacheck``;
* ``slurm``: the Slurm backend (submitit submission, the job's task, profiles, events, polling,
  status, wait, collect, retry).

A floor imports only floors below it (tests/test_layers.py). See docs/internals.md."""
