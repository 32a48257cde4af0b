"""The Slurm backend, the top floor of ``harness.launch``: ``submit`` (plan, render and submit
job arrays with submitit; the sweep's job record ``slurm/jobs.json``), ``job`` (a case's task in
its allocation), ``profiles``, ``events``, ``poll``, ``status``, ``wait``, ``collect``,
``retry``."""
