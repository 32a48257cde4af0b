"""Which backend runs a sweep folder: the one that started it.

``run`` and ``submit`` start a sweep on the backend they are named for (this machine, Slurm);
every later command on the folder (``status``, ``collect``) asks :func:`backend_of`, which asks
each backend's module (a ``sweep_backend.BackendKind``: ``owns``, ``follow``) in turn: Slurm owns
a folder where ``submit`` recorded its jobs, the local backend any other folder with a manifest.
A third backend is one folder beside ``local/`` and ``slurm/`` and its module in
:data:`BACKENDS`, before ``local`` (the backend of any folder with a manifest).
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import ConfigError
from harness.launch.local import backend as local
from harness.launch.slurm import backend as slurm
from harness.launch.sweep_backend import BackendKind, FollowOptions, SweepBackend
from harness.results import MANIFEST_FILE

# Asked in this order; the first that owns a folder runs it.
BACKENDS: tuple[BackendKind, ...] = (slurm, local)


def backend_of(sweep_dir: Path, options: FollowOptions = FollowOptions()) -> SweepBackend:
    """The backend that runs the sweep in ``sweep_dir``, following it with ``options``;
    ConfigError for a folder no backend owns."""
    for kind in BACKENDS:
        if kind.owns(Path(sweep_dir)):
            return kind.follow(options)
    raise ConfigError(f"{sweep_dir} holds no sweep (no {MANIFEST_FILE}, no slurm/jobs.json); pass "
                      "the --out folder of `dcp-harness run` or `dcp-harness submit`")
