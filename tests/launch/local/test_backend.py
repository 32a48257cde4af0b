"""The local backend (``launch.local.backend``): ``run``'s submit, wait and collect, and the
pipeline's sinks at its end. One real CPU run (rank processes, gloo); the rest with a launcher
that runs no processes (``test_sweep.RecordingLauncher``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.arms import plan_cases
from harness.cli import main
from harness.errors import ConfigError
from harness.launch.local.launcher import LocalLauncher
from harness.launch.local.backend import LocalBackend, run_sweep
from harness.launch.pipeline import run_to_end
from harness.launch.sweep_backend import Collection
from harness.spec import load_cases
from tests.launch.local.test_sweep import RecordingLauncher


def states(backend: LocalBackend, out: Path) -> dict[str, str]:
    return {cid: s.state for cid, s in backend.state(out).items()}


def test_a_real_run_reaches_the_sinks_once_with_its_verdicts_and_reports(write_case, tmp_path):
    plans = plan_cases(load_cases([write_case("one", train={"steps": 2})]))
    out = tmp_path / "out"
    seen: list[tuple[Path, str, bool]] = []

    def sink(collection: Collection) -> None:  # what a history database reads, there already
        sweep_dir = collection.out_dir
        verdict = json.loads((sweep_dir / "one" / "verdict.json").read_text())["status"]
        seen.append((sweep_dir, verdict, (sweep_dir / "summary.md").is_file()))

    with LocalLauncher(warm=False) as launcher, LocalBackend(launcher) as backend:
        done = run_to_end(backend, plans, out, sinks=[sink])
    assert seen == [(out, "pass", True)]
    assert done.finished and [v.status for v in done.verdicts] == ["pass"]
    assert done.sweep.exists


def test_state_follows_the_verdicts_and_the_lock_is_held_until_collect(write_case, tmp_path):
    plans = plan_cases(load_cases([write_case("a"), write_case("b", compare={"repeat": {}})]))
    out = tmp_path / "out"
    launcher = RecordingLauncher(fail={"eager-repeat": "failed"})
    with LocalBackend(launcher) as backend:
        backend.wait(out)  # nothing submitted and no run holds the folder: nothing to wait for
        assert launcher.calls == []
        backend.submit(plans, out)
        assert states(backend, out) == {"a": "pending", "b": "pending"}
        with pytest.raises(ConfigError, match="being written by another sweep"):
            run_sweep(plans, out, RecordingLauncher())
        backend.wait(out)
        assert states(backend, out) == {"a": "done", "b": "error"}
        collected = backend.collect(out)
    assert collected.finished and (out / "summary.md").is_file()
    assert launcher.calls == [("a", "eager"), ("b", "eager"), ("b", "eager-repeat")]
    run_sweep(plans, out, RecordingLauncher())  # released: a resume may start


def test_run_sweep_hands_the_sweep_to_its_sinks_once(write_case, tmp_path):
    plans = plan_cases(load_cases([write_case("a")]))
    got: list[Path] = []
    result = run_sweep(plans, tmp_path / "out", RecordingLauncher(), sinks=[lambda c: got.append(c.out_dir)])
    assert got == [tmp_path / "out"] and [v.status for v in result.verdicts] == ["pass"]


def test_dcp_harness_run_calls_the_cli_s_sinks_once(write_case, tmp_path, monkeypatch):
    import harness.cli.run_cmd as run_cmd

    class Launcher(RecordingLauncher):  # runs no processes; a context manager as LocalLauncher
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    got: list[Path] = []
    monkeypatch.setattr(run_cmd, "LocalLauncher", lambda **kw: Launcher())
    monkeypatch.setattr(run_cmd, "sweep_sinks", lambda args: [lambda c: got.append(c.out_dir)])
    out = tmp_path / "out"
    assert main(["run", str(write_case("a")), "--out", str(out)]) == 0
    assert got == [out]


def test_the_figures_drawn_ahead_stand_still_while_an_arm_that_runs_alone_runs(tmp_path):
    from harness.launch.local.backend import _DrawingAhead
    from harness.launch.local.progress import NullProgress
    from harness.results import ArmOutcome

    class Ahead:
        def __init__(self):
            self.calls = []

        def hold(self, key):
            self.calls.append(("hold", key))

        def release(self, key):
            self.calls.append(("release", key))

    ahead = Ahead()
    shown = _DrawingAhead(NullProgress(), ahead, {("case", "dcp")})
    for arm in ("dcp", "fixed-cp2"):
        shown.arm_started("case", arm, tmp_path, 4)
        shown.arm_finished("case", arm, ArmOutcome(status="ok"))
    assert ahead.calls == [("hold", ("case", "dcp")), ("release", ("case", "dcp")),
                           ("release", ("case", "fixed-cp2"))]  # releasing a key not held: nothing
