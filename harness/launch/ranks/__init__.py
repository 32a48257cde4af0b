"""Starting rank processes, the bottom floor of ``harness.launch``: ``rank_main`` (the program
every rank runs), ``processes`` (a process per rank: commands, environment, logs, time limits,
teardown), ``ports`` (rendezvous ports), ``warm`` / ``forkserver`` (warm rank processes),
``emulated`` (emulated ranks, each alone), ``command`` (command cases' training processes),
``repro`` (the repro line), ``failures``, ``placement``, ``completion``. Imports nothing of
``harness.launch`` above it."""
