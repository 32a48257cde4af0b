"""Pure modules import without torch (harness.workload's package init loads its names lazily)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import harness

ROOT = Path(harness.__file__).resolve().parents[1]

# Modules that must never pull in torch: the leaves, the arms, the CLI and the launchers' parent
# side (ranks import torch themselves, in their own processes).
PURE = (
    "harness.workload",
    "harness.spec.derive",
    "harness.arms",
    "harness.compare",
    "harness.results",
    "harness.report",
    "harness.spec",
    "harness.cli",
    "harness.launch.sweep_folder",
    "harness.launch.local.launcher",
    "harness.launch.local.backend",
    "harness.launch.local.lanes",
    "harness.workload.datacheck",
    "harness.launch.slurm.submit",
    "harness.launch.slurm.job",
    "harness.launch.slurm.poll",
    "harness.launch.slurm.status",
    "harness.launch.slurm.wait",
    "harness.launch.slurm.collect",
    "harness.launch.slurm.retry",
    "harness.launch.ranks.emulated",
    "harness.launch.ranks.processes",
    "harness.trust.stored_plan",
    "harness.spec.places",
    "harness.sites",
    "harness.report.emulated",
    "harness.workload.allocsites",
)


def _torch_after_import(module: str) -> bool:
    code = f"import sys, {module}; sys.exit(1 if 'torch' in sys.modules else 0)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 1


@pytest.mark.parametrize("module", PURE)
def test_module_imports_without_torch(module: str) -> None:
    assert not _torch_after_import(module), f"importing {module} imported torch"


def test_workload_names_still_load_on_use() -> None:
    import harness.workload as workload
    from harness.workload.train import train_arm

    assert workload.train_arm is train_arm
    assert callable(workload.train_arm) and callable(workload.init_distributed)
    assert set(workload.__all__) <= set(dir(workload))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        workload.nope  # noqa: B018
