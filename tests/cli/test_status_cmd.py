"""`dcp-harness status` through the sweep's backend: a local sweep (``dcp-harness run``) read from
its folder while it runs, once it ended and once it was interrupted (the backend picked by what
the folder holds: ``tests/launch/test_backends.py``). The Slurm table: ``tests/launch/slurm/test_status_table.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.arms import plan_cases
from harness.cli import main
from harness.launch.local.backend import LocalBackend, run_sweep
from harness.spec import load_cases
from tests.launch.cases import write_case_file
from tests.launch.local.test_sweep import RecordingLauncher


@dataclass
class PeekingLauncher(RecordingLauncher):
    """Runs as :class:`RecordingLauncher` and, once the arms of ``peek_at`` wrote their steps, reads
    the sweep as another process would (a backend of its own); ``stop_at`` is interrupted (Ctrl-C)."""

    peek_at: str = ""
    stop_at: str = ""
    seen: dict = field(default_factory=dict)

    def run_arm(self, plan, arm, arm_dir, case_json):
        if plan.case_id == self.stop_at:
            raise KeyboardInterrupt
        outcome = super().run_arm(plan, arm, arm_dir, case_json)
        if plan.case_id == self.peek_at:
            self.seen = LocalBackend().state(Path(arm_dir).parent.parent)
        return outcome


def sweep_of(tmp_path: Path, *names: str):
    return plan_cases(load_cases([write_case_file(tmp_path / "cases", n, train={"steps": 3})
                                  for n in names]))


def test_while_a_run_writes_the_folder_each_case_is_done_running_or_pending(tmp_path):
    out = tmp_path / "out"
    launcher = PeekingLauncher(peek_at="b")
    run_sweep(sweep_of(tmp_path, "a", "b", "c"), out, launcher)
    seen = launcher.seen
    assert [(s.case_id, s.state, s.terminal) for s in seen.values()] == [
        ("a", "done", True), ("b", "running", False), ("c", "pending", False)]
    b = seen["b"]
    assert (b.arm, b.step, b.steps, b.arms_done, b.arms_total) == ("eager", 3, 3, 0, 1)
    assert (seen["a"].verdict, seen["c"].arms_total) == ("pass", 1)
    assert all(s.job_id == "" for s in seen.values())  # no jobs: no job or scheduler column


def test_status_of_a_finished_run_shows_no_job_columns(tmp_path, capsys):
    out = tmp_path / "out"
    run_sweep(sweep_of(tmp_path, "a", "b"), out, RecordingLauncher(fail={"eager": "failed"}))
    assert main(["status", str(out), "--watch", "1"]) == 0  # every case ended: returns at once
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if "case" in line and "state" in line)
    assert "job" not in header and "slurm" not in header
    assert "2/2 ended: 0 pending, 0 running, 0 done, 0 failed, 2 error" in text


def test_an_interrupted_run_leaves_errors_that_say_how_to_resume(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep_of(tmp_path, "a", "b", "c"), out, PeekingLauncher(stop_at="b"))
    seen = LocalBackend().state(out)
    assert [(s.case_id, s.state, s.terminal) for s in seen.values()] == [
        ("a", "done", True), ("b", "error", True), ("c", "error", True)]
    assert "interrupted" in seen["b"].detail and f"--out {out}" in seen["c"].detail
    assert main(["status", str(out)]) == 0
    assert "1 done, 0 failed, 2 error" in capsys.readouterr().out
