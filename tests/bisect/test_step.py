"""The oracle (harness.bisect.step.judge) and a command case's copy per step
(harness.bisect.target.copy_command_cases), on hand-made folders: no sweep runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.bisect.search import Verdict
from harness.bisect.state import Mode
from harness.bisect.step import failing_checks, judge
from harness.bisect.target import Target, copy_command_cases, step_command
from harness.spec.loader import load_case_file


def verdict(sweep: Path, case: str, status: str, checks=()) -> None:
    (sweep / case).mkdir(parents=True, exist_ok=True)
    entry = {"case_id": case, "pair": "reference", "contract": "reference", "arms": ["dcp"],
             "status": status, "error": None, "checks": list(checks)}
    (sweep / case / "verdict.json").write_text(json.dumps(
        {"case_id": case, "status": status, "pairs": [entry]}))


LOSS = {"name": "loss", "value": 0.25, "bound": 1e-5, "passed": False, "applicable": True,
        "detail": "step 1"}


def test_exit_1_with_a_failing_verdict_is_bad_and_names_the_check(tmp_path: Path) -> None:
    verdict(tmp_path, "a", "fail", [LOSS, {**LOSS, "name": "grad_norm", "passed": True}])
    verdict(tmp_path, "b", "pass")
    judged = judge(1, tmp_path, tmp_path / "step.log")
    assert judged.verdict is Verdict.BAD
    assert [f.line() for f in failing_checks(tmp_path)] == [
        "a / reference / loss: 0.25 (bound 1e-05): step 1"]


@pytest.mark.parametrize("code, why", [
    (1, "exit 1 but no case verdict says fail: a crash, not a regression"),
    (0, "exit 0 but the sweep holds no verdict"),
    (2, "exit 2 (an error or infrastructure failure)"),
    (-9, "ended by signal 9")])
def test_anything_else_is_a_skip_with_the_reason(tmp_path: Path, code: int, why: str) -> None:
    if code != 0:
        verdict(tmp_path, "a", "pass" if code == 1 else "error")
    log = tmp_path / "step.log"
    log.write_text("line\nTraceback (most recent call last):\nValueError: boom\n")
    judged = judge(code, tmp_path, log)
    assert judged.verdict is Verdict.SKIP and judged.detail.startswith(why)
    assert "ValueError: boom" in judged.detail and str(log) in judged.detail


def test_exit_0_with_a_judged_case_is_good(tmp_path: Path) -> None:
    verdict(tmp_path, "a", "pass")
    assert judge(0, tmp_path, tmp_path / "step.log").verdict is Verdict.GOOD


def test_a_command_case_copy_runs_in_the_worktree_with_its_golden_folder(tmp_path: Path) -> None:
    repo, worktree = tmp_path / "repo", tmp_path / "wt"
    (repo / "sub").mkdir(parents=True)
    cases = tmp_path / "cases"
    (cases / "golden" / "toy").mkdir(parents=True)
    (cases / "golden" / "toy" / "golden_values_cpu.json").write_text("{}\n")
    (cases / "toy.yaml").write_text(
        "# a comment\nname: toy\nresources: {gpus_per_node: 1}\n"
        "train: {steps: 2, global_batch: 8, seq_length: 16, lr: 1.0e-3}\n"
        "command: {argv: [python, train.py], cwd: ../repo/sub, metrics: {source: jsonl}}\n"
        "compare: {golden: {}}\n")
    target = Target(Mode.COMMAND, repo.resolve(), (cases.resolve(),), None)
    (copy,) = copy_command_cases(target, worktree, tmp_path / "step" / "cases")
    (loaded,) = load_case_file(copy)
    assert loaded.case.command.cwd == str(worktree / "sub")
    assert (copy.parent / "golden" / "toy" / "golden_values_cpu.json").is_file()
    assert (cases / "toy.yaml").read_text().startswith("# a comment")  # the original untouched


def test_a_slurm_step_submitted_before_an_interruption_is_collected_not_resubmitted(
        tmp_path: Path) -> None:
    from harness.bisect.target import step_command

    target = Target(Mode.COMMAND, tmp_path, (tmp_path / "c.yaml",), "toy")
    sweep = tmp_path / "sweep"
    assert step_command(target, ["c.yaml"], sweep, "local", collect=False)[3:] == [
        "submit", "c.yaml", "--profile", "local", "--out", str(sweep), "--wait", "-k", "toy"]
    assert step_command(target, ["c.yaml"], sweep, "local", collect=True)[3:] == [
        "collect", str(sweep), "--wait"]


def test_a_command_step_leaves_the_users_results_latest(tmp_path: Path) -> None:
    """A command case's step runs this harness in the user's directory: `--no-latest` keeps
    `results/latest` on the user's own sweep. A built-in step runs its commit's own harness (which
    may not know the flag) in its worktree, where a `results/latest` harms no one."""
    sweep = tmp_path / "sweep"
    for mode, keep in ((Mode.COMMAND, True), (Mode.BUILTIN, False)):
        argv = step_command(Target(mode, tmp_path, (tmp_path / "c.yaml",), "x"), ["c.yaml"], sweep,
                            None, collect=False)
        assert argv[argv.index("run"):] == ["run", "c.yaml", "--out", str(sweep),
                                            *(["--no-latest"] if keep else []), "-k", "x"]
