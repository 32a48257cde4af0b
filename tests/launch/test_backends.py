"""Which backend runs a sweep folder (``launch.backends``), and one judgment per case whatever the
backend: ``run``, ``submit``, ``collect`` judge each case once in their process, and the
reports, the history sink and the gate reuse that verdict (``Collection``). The Slurm backend here
answers from a scripted scheduler (``slurm_fakes``); ``slurm/test_cluster.py`` counts the same on
the dev cluster."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import pytest

import harness.cli.run_cmd as run_cmd
import harness.launch.slurm.backend as slurm_backend
from harness.arms import plan_cases
from harness.cli import main
from harness.errors import ConfigError
from harness.launch.backends import backend_of
from harness.launch.local.backend import LocalBackend, run_sweep
from harness.launch.slurm.backend import SlurmBackend
from harness.launch.sweep_backend import FollowOptions
from harness.launch.sweep_folder import record_manifest, sweep_start
from harness.results import ArmOutcome, sweep_lock, write_outcome
from harness.spec import load_cases
from tests.launch.local.test_sweep import RecordingLauncher
from tests.launch.slurm_fakes import Scheduler, steps

ENDED = Scheduler(squeue="", sacct="41|COMPLETED|0:0\n")


class Launcher(RecordingLauncher):
    """Runs no processes; a context manager as ``LocalLauncher`` is."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_the_backend_is_the_one_that_wrote_the_folder(write_case, tmp_path):
    out = tmp_path / "out"
    run_sweep(plan_cases(load_cases([write_case("a")])), out, RecordingLauncher())
    assert isinstance(backend_of(out), LocalBackend)
    (out / "slurm").mkdir()
    (out / "slurm" / "jobs.json").write_text("{}")
    assert isinstance(backend_of(out), SlurmBackend)
    with pytest.raises(ConfigError, match="holds no sweep .*`dcp-harness run` or `dcp-harness submit`"):
        backend_of(tmp_path / "cases")
    (out / "slurm" / "jobs.json").unlink()
    with pytest.raises(ConfigError, match="--retry-infra re-submits Slurm jobs"):
        backend_of(out, FollowOptions(retry_infra=1))


def test_run_then_collect_then_gate_judge_each_case_once(write_case, tmp_path, monkeypatch,
                                                         judgments, capsys):
    monkeypatch.setattr(run_cmd, "LocalLauncher", lambda **kw: Launcher(fail={"eager-repeat": "failed"}))
    cases = [write_case("a"), write_case("b", compare={"repeat": {}})]
    out = tmp_path / "out"
    assert main(["run", *map(str, cases), "--out", str(out)]) == 2  # b's repeat arm failed: an error
    assert dict(judgments) == {"a": 1, "b": 1}  # the reports, the history, the gate: reused
    assert "history: added" in capsys.readouterr().out  # the test's own database (conftest.py)
    for argv in (["collect", str(out)], ["collect", str(out), "--wait"], ["gate", str(out)]):
        judgments.clear()
        main(argv)  # another process: each stored verdict checked against its records, once
        assert dict(judgments) == {"a": 1, "b": 1}, argv
    assert "next: dcp-harness gate" in capsys.readouterr().out


def test_collect_of_an_interrupted_run_judges_what_ended_once(write_case, tmp_path, judgments):
    out = tmp_path / "out"
    run_sweep(plan_cases(load_cases([write_case("a"), write_case("b")])), out, RecordingLauncher())
    (out / "b" / "verdict.json").unlink()  # interrupted after b's last arm, before its verdict
    judgments.clear()
    done = backend_of(out).collect(out)
    assert [v.case_id for v in done.verdicts] == ["b"] and (out / "b" / "verdict.json").is_file()
    assert dict(judgments) == {"a": 1, "b": 1}
    assert done.finished and done.sweep.status == "pass"


def test_a_local_sweep_being_written_is_waited_for_from_another_process(write_case, tmp_path):
    out = tmp_path / "out"
    run_sweep(plan_cases(load_cases([write_case("a")])), out, RecordingLauncher())
    polls: list[list] = []
    backend = backend_of(out, FollowOptions(poll_s=0.01, on_poll=polls.append))
    held, release = threading.Event(), threading.Event()

    def run_holding_the_lock() -> None:  # what a `dcp-harness run` into the folder holds
        with sweep_lock(out):
            held.set()
            release.wait(5)

    writer = threading.Thread(target=run_holding_the_lock)
    writer.start()
    held.wait(5)
    try:
        with pytest.raises(ConfigError, match="being written by another sweep.*collect .* --wait"):
            backend.collect(out)
        backend.wait(out, timeout_s=0.05)  # gives up: the run still holds it
        assert polls and polls[-1][0].state == "done"
        threading.Timer(0.1, release.set).start()
        started = time.monotonic()
        backend.wait(out)  # returns once the run let go of the folder
        assert time.monotonic() - started < 5
    finally:
        release.set()
        writer.join()
    assert backend.collect(out).finished


def finished_arms(case_dir: Path) -> None:
    for arm in ("eager", "eager-repeat"):
        steps(case_dir / arm, 3)
        write_outcome(case_dir / arm, ArmOutcome(status="ok", returncode=0))


def test_slurm_collect_judges_each_case_once(sweep, monkeypatch, judgments, capsys):
    out, plan, ref = sweep
    record_manifest([plan], out, sweep_start("submit", [plan.case], 0))  # as submit records it
    finished_arms(out / "t")
    monkeypatch.setattr(slurm_backend, "SlurmBackend", functools.partial(SlurmBackend, runner=ENDED))
    assert main(["collect", str(out), "--wait", "--poll-s", "0.01"]) == 0
    assert dict(judgments) == {"t": 1}  # judged by collect; reports, history, gate reused it
    printed = capsys.readouterr().out
    assert "history: added" in printed and "gate: PASS" in printed
    judgments.clear()
    assert main(["collect", str(out)]) == 0  # its stored verdict checked once
    assert dict(judgments) == {"t": 1}


def test_a_case_skipped_at_submit_is_judged_once_by_submit_and_its_collection(
        write_case, tmp_path, judgments, capsys):
    case = write_case("gpu", resources={"device": "cuda", "profile": "local"})
    out = tmp_path / "out"
    # nothing ran, so nothing passed: the gate's exit 2 for a sweep of skipped cases only
    assert main(["submit", str(case), "--out", str(out), "--wait", "--poll-s", "0.01"]) == 2
    printed = capsys.readouterr().out
    assert "skipped gpu:" in printed and "submitted nothing" in printed
    assert dict(judgments) == {"gpu": 1}  # at submit; the collection and the gate reused it
    assert (out / "summary.md").is_file() and "history: added" in printed
    assert "gate: SKIPPED" in printed
