"""Real CPU runs: rank processes (gloo) train the tiny workload through ``dcp-harness run``.

Faults are injected by the tests (``tests/launch/faults.py``): the ranks start with ``fault_env``,
which wraps the ``on_step`` callback of their training; the launcher and ``rank_main`` are the real
ones.
"""

import json
import os

import pytest

from harness.arms import plan_cases
from harness.cli import main, run_cmd
from harness.errors import ConfigError
from harness.launch.local.launcher import LocalLauncher
from harness.launch.local.backend import run_sweep
from harness.report import gate
from harness.results import read_outcome, read_steps
from harness.spec import load_cases

from tests.launch.faults import FAULT_ENV, fault_env


def inject(monkeypatch, spec):
    """The ranks the launcher starts from now on fail as ``spec`` says."""
    for key, value in fault_env(spec).items():
        monkeypatch.setenv(key, value)


def run_cli(*argv: str) -> int:
    return main(["run", *argv])


def test_one_rank_and_two_rank_cases_pass_the_gate_then_resume(write_case, tmp_path, capsys):
    one = write_case("one-rank", train={"steps": 2})
    two = write_case("two-rank", compare={"repeat": {}}, resources={"gpus_per_node": 2})
    out = tmp_path / "out"
    assert run_cli(str(one), str(two), "--out", str(out)) == 0
    printed = capsys.readouterr()
    assert "results:" in printed.out and "two-rank" in printed.out
    steps = read_steps(out / "two-rank" / "eager-repeat")
    assert sorted(steps) == [0, 1] and [r.step for r in steps[1]] == [1, 2, 3]
    assert steps[0][0].loss == read_steps(out / "two-rank" / "eager")[0][0].loss
    assert json.loads((out / "two-rank" / "verdict.json").read_text())["status"] == "pass"
    for name in ("summary.md", "junit.xml", "index.json"):
        assert (out / name).is_file()
    assert not (out / "two-rank" / "eager" / "checkpoint").exists()  # complete arms drop them
    log = (out / "two-rank" / "eager" / "log.txt").read_text()
    assert "[rank 1]" in log and "step 3/3 loss" in log

    # A second run into the same folder has nothing left to do.
    assert run_cli(str(one), str(two), "--out", str(out)) == 0
    assert "skipped (already complete)" in capsys.readouterr().err


def test_crashing_rank_fails_its_case_and_the_sweep_goes_on(write_case, tmp_path, monkeypatch):
    crashing = write_case("crashing", resources={"gpus_per_node": 2})
    short = write_case("short", train={"steps": 1})  # never reaches the faulty step
    inject(monkeypatch, "crash@2:1")
    out = tmp_path / "out"
    result = run_sweep(plan_cases(load_cases([crashing, short])), out, LocalLauncher())
    assert [v.status for v in result.verdicts] == ["error", "pass"]
    outcome = read_outcome(out / "crashing" / "eager")
    assert outcome.status == "failed" and outcome.returncode == 1
    assert "rank 1 exited with exit code 1" in outcome.detail
    assert "injected fault: crash at step 2 on rank 1" in outcome.log_tail
    assert "harness.launch.local" in outcome.repro and "--arm eager" in outcome.repro
    assert str((out / "crashing" / "case.json").resolve()) in outcome.repro
    # rank 0 was blocked in a collective of step 2; it was stopped, not left running.
    assert "stopped rank(s) 0" in outcome.detail or "also rank(s) 0" in outcome.detail
    assert [r.step for r in read_steps(out / "crashing" / "eager")[1]] == [1]
    assert gate(out) == 2


@pytest.mark.slow
def test_hung_rank_times_out_with_stacks_then_resumes(write_case, tmp_path, monkeypatch):
    hanging = write_case("hanging", resources={"gpus_per_node": 2})
    out = tmp_path / "out"
    inject(monkeypatch, "hang@2:1")
    cases = plan_cases(load_cases([hanging]))
    result = run_sweep(cases, out, LocalLauncher(timeout_min=0.3, stack_wait_s=5.0, kill_grace_s=2.0))
    assert result.verdicts[0].status == "error"
    outcome = read_outcome(out / "hanging" / "eager")
    assert outcome.status == "timeout"
    assert "rank(s) 0, 1 still running" in outcome.detail or "rank(s) 1 still running" in outcome.detail
    stacks = outcome.log_tail.split("Python stacks")[1]
    assert "in trigger_fault" in stacks  # rank 1, sleeping in the injected hang
    assert "in train_arm" in stacks  # rank 0, waiting for rank 1 inside training

    monkeypatch.delenv(FAULT_ENV)
    result = run_sweep(cases, out, LocalLauncher())
    assert result.verdicts[0].status == "pass"
    log = (out / "hanging" / "eager" / "log.txt").read_text()
    assert "1/3 steps already recorded" in log  # resumed after step 1, the last recorded step
    steps = read_steps(out / "hanging" / "eager")
    assert all([r.step for r in steps[k]] == [1, 2, 3] for k in (0, 1))
    assert gate(out) == 0


def test_config_errors_exit_2_before_anything_is_written(write_case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    good = write_case("good")
    bad = tmp_path / "cases" / "bad.yaml"
    bad.write_text("name: bad\ntrain: {steps: 1, global_batch: 4, seq_length: 64, lr: 1.0e-3}\n"
                   "resources: {gpus_per_node: 3}\nparallel: {pp: 2}\n")
    for argv, message in [
        ((str(good), "-k", "nothing-matches"), "no case selected"),
        ((str(good), "--timeout-min", "0"), "--timeout-min"),
        ((str(bad),), "bad.yaml"),
        ((str(tmp_path / "missing.yaml"),), "missing.yaml"),
    ]:
        assert run_cli(*argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err, err
    assert not (tmp_path / "results").exists()


def test_default_out_is_timestamped_with_latest_symlink(tmp_path):
    from datetime import datetime, timezone

    root = tmp_path / "results"
    now = datetime(2026, 11, 29, 22, 0, 5, tzinfo=timezone.utc)
    first = run_cmd.default_out_dir(root, now)
    assert first == root / "20261129T220005Z"
    first.mkdir(parents=True)
    second = run_cmd.default_out_dir(root, now)
    assert second == root / "20261129T220005Z-2"
    second.mkdir()
    link = run_cmd.point_latest(root, first)
    assert os.readlink(link) == "20261129T220005Z" and link.resolve() == first.resolve()
    run_cmd.point_latest(root, second)
    assert link.resolve() == second.resolve()
    link.unlink()
    link.mkdir()
    with pytest.raises(ConfigError, match="not a symlink"):
        run_cmd.check_latest(root)
