import sys
from collections import Counter
from pathlib import Path
from typing import Callable

import pytest

from tests.launch.cases import write_case_file
from tests.launch.faults import FAULT_ENV, PATCH_ENV
from tests.launch.slurm_fakes import submitted_sweep


@pytest.fixture
def write_case(tmp_path: Path) -> Callable[..., Path]:
    """write_case(name, **sections) -> path of a tiny CPU case file (sections merged into TINY)."""
    folder = tmp_path / "cases"

    def write(name: str, **sections) -> Path:
        return write_case_file(folder, name, **sections)

    return write


@pytest.fixture(autouse=True)
def _no_inherited_fault(monkeypatch):
    monkeypatch.delenv(FAULT_ENV, raising=False)
    monkeypatch.delenv(PATCH_ENV, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture
def sweep(tmp_path: Path):
    """A sweep of one tiny case submitted as Slurm job 41 an hour ago: (folder, plan, job)."""
    return submitted_sweep(tmp_path)


@pytest.fixture
def judgments(monkeypatch) -> Counter:
    """Case id -> how many times this process judged it: every call of the one judge
    (``harness.judge.judge``), wherever a module of the harness imported it (the CLI's, loaded
    first, with everything it runs)."""
    import harness.cli  # noqa: F401  (every module a command runs, so each holds the judge now)
    import harness.judge as judge_module

    counted: Counter = Counter()
    real = judge_module.judge

    def judge(plan, *args, **kwargs):
        counted[plan.case_id] += 1
        return real(plan, *args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("harness") and getattr(module, "judge", None) is real:
            monkeypatch.setattr(module, "judge", judge)
    return counted


@pytest.fixture(autouse=True)
def _cpu_pins_restored(monkeypatch):
    """A Slurm task run in the test's own process (``run_case_arms``) pins CPU ranks' settings
    into ``os.environ`` (``slurm.job.pin_cpu_task``), as the task's process would: each test
    gets them back as they were."""
    import os

    from harness.launch.ranks.processes import CPU_RANK_SETTINGS

    for key in CPU_RANK_SETTINGS:
        if key in os.environ:
            monkeypatch.setenv(key, os.environ[key])
        else:
            monkeypatch.setenv(key, "unset-after-the-test")
            monkeypatch.delenv(key)
