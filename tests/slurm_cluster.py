"""The Slurm cluster the ``slurm``-marked tests submit to: skipped, saying how to start one, when
none answers here (``slurm/devcluster/start.sh`` as root; ``.ci/slurm.sh`` in CI)."""

from __future__ import annotations

import subprocess

import pytest


def skip_unless_cluster_up() -> None:
    """pytest.skip unless Slurm's commands are here and slurmctld answers ``scontrol ping``."""
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no Slurm here: run slurm/devcluster/start.sh (as root) first")
    if ping.returncode != 0 or "UP" not in ping.stdout:
        pytest.skip(f"slurmctld is not up ({ping.stdout.strip() or ping.stderr.strip()}): "
                    "run slurm/devcluster/start.sh")


@pytest.fixture(scope="module")
def slurm_cluster() -> None:
    """For a module of Slurm tests: ``pytestmark = [..., pytest.mark.usefixtures("slurm_cluster")]``."""
    skip_unless_cluster_up()
