"""The -resumed arm of a command case (``harness.launch.ranks.command_resume``) on real Megatron-LM log
lines, and the resume pair on them.

``tests/metrics/data/megatron_h100_*.log`` are the iteration and memory lines Megatron-LM
(``d98e8a6``, ``pretrain_gpt.py`` of ``cases/megatron/pretrain-gpt-tiny.yaml``) printed on one
H100 (bench/RESULTS-log.md, 2026-12-06): the eager arm, and its -resumed twin saved at iteration
10, exited and loaded (the launcher's "second run" line between its runs). Megatron's TensorBoard
scalars of that run are bitwise the same on every iteration; its log line of iteration 12 (the
second run's second iteration) prints the mean of iterations 11 and 12, as its line of iteration
2 does in every run: the resume pair must pass it as that, name it, and still fail a real
difference there or anywhere after the stop."""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.compare import Pair
from harness.launch.ranks.command_resume import (Checkpointed, first_run_problem, joined,
                                           read_iteration_file)
from harness.metrics import SourceMark, read_between, read_source, source_mark
from harness.spec.schema import MetricsSource, MetricsSpec
from tests.test_compare import OK, by_name, one

DATA = Path(__file__).resolve().parents[2] / "metrics" / "data"
LOG = MetricsSpec(source=MetricsSource.MEGATRON_LOG)
SECOND = b"second run (command.resume.load)"


def _arm(tmp_path: Path, name: str, edit: tuple[str, str] = ("", "")) -> Path:
    arm = tmp_path / name
    arm.mkdir()
    shutil.copy(DATA / f"megatron_h100_{name}.log", arm / "log.txt")
    if edit[0]:
        text = (arm / "log.txt").read_text()
        assert edit[0] in text
        (arm / "log.txt").write_text(text.replace(edit[0], edit[1]))
    return arm


def _resumed(arm: Path, checkpoint: int = 10) -> dict:
    """The -resumed arm's records as the launcher joins them: each run's lines read apart."""
    data = (arm / "log.txt").read_bytes()
    cut = data.rfind(b"\n", 0, data.find(SECOND)) + 1
    start, middle = SourceMark(), SourceMark(log_bytes=cut)
    assert source_mark(LOG, arm, "log.txt", (0,)).log_bytes == len(data)
    first = read_between(LOG, arm, (0,), "h100", "log.txt", start, middle)
    second = read_between(LOG, arm, (0,), "h100", "log.txt", middle)
    assert first_run_problem(first, 10) is None
    return joined(first, second, 10, Checkpointed(step=checkpoint))


# As the plan marks them for this source (harness.arms.command_pair): Megatron logs no aux loss here.
NO_AUX = {"aux_loss": "no aux loss", "aux_loss_first_interval": "no aux loss"}


def _judge(tmp_path: Path, log_lines: bool = True, edit: tuple[str, str] = ("", "")):
    tmp_path = tmp_path / f"{log_lines}{len(list(tmp_path.iterdir()))}"
    tmp_path.mkdir()
    ref = read_source(LOG, _arm(tmp_path, "eager"), (0,), "h100", path="log.txt")
    res = _resumed(_arm(tmp_path, "eager-resumed", edit))
    pair = Pair("resume", "resume", ("eager-resumed", "eager"),
                {"after": 10, "log_lines": log_lines, "loss": "exact"}, not_applicable=NO_AUX)
    verdict = one([pair], {"eager-resumed": (OK, res), "eager": (OK, ref)},
                  expected_steps=20, expected_ranks=1)
    return verdict.pairs[0], by_name(verdict.pairs[0])


def test_megatrons_resumed_log_passes_naming_its_averaged_line(tmp_path: Path) -> None:
    entry, checks = _judge(tmp_path)
    assert entry.status == "pass", [c for c in entry.checks if not c.passed]
    assert checks["resumed_after"].passed and checks["loaded_checkpoint"].passed
    assert "(step 12: *_first_interval)" in checks["loss"].detail
    assert checks["loss"].detail.endswith("bitwise equal over 9 steps")  # 11, 13-20
    first = checks["loss_first_interval"]
    assert "step 12: 6.39265 (resumed) is the mean of the uninterrupted run's steps 11 and 12" \
        in first.detail
    assert checks["grad_norm"].detail.endswith("bitwise equal over 10 steps")  # 12 included


def test_read_as_per_iteration_values_the_pair_names_iteration_12(tmp_path: Path) -> None:
    entry, checks = _judge(tmp_path, log_lines=False)
    assert entry.status == "fail"
    assert [c.name for c in entry.failed_checks] == ["loss"]
    assert "differs at step 12 (6.39265 vs 6.35693)" in checks["loss"].detail


def test_a_real_difference_after_the_stop_still_fails_naming_the_step(tmp_path: Path) -> None:
    # Iteration 14 of the second run, one unit in the last printed place off.
    entry, checks = _judge(tmp_path, edit=("lm loss: 6.239078E+00", "lm loss: 6.239079E+00"))
    assert entry.status == "fail"
    assert "differs at step 14 (6.23908 vs 6.23908)" in checks["loss"].detail
    # The averaged line itself, off by more than its printing can explain.
    entry, checks = _judge(tmp_path, edit=("lm loss: 6.392653E+00", "lm loss: 6.392660E+00"))
    assert [c.name for c in entry.failed_checks] == ["loss_first_interval"]
    assert "is neither the uninterrupted run's 6.35693 nor the mean" in \
        checks["loss_first_interval"].detail


def test_a_checkpoint_of_another_step_fails_loaded_checkpoint(tmp_path: Path) -> None:
    ref = read_source(LOG, _arm(tmp_path, "eager"), (0,), "h100", path="log.txt")
    res = _resumed(_arm(tmp_path, "eager-resumed"), checkpoint=9)
    pair = Pair("resume", "resume", ("eager-resumed", "eager"), {"after": 10, "log_lines": True},
                not_applicable=NO_AUX)
    checks = by_name(one([pair], {"eager-resumed": (OK, res), "eager": (OK, ref)},
                         expected_steps=20, expected_ranks=1).pairs[0])
    assert not checks["loaded_checkpoint"].passed
    assert "loaded a checkpoint that holds step 9" in checks["loaded_checkpoint"].detail


def test_first_run_problems_and_the_iteration_file(tmp_path: Path) -> None:
    from harness.results import StepRecord

    def recs(*steps: int) -> dict:
        return {0: [StepRecord(step=s, loss=1.0) for s in steps]}

    assert first_run_problem(recs(1, 2), 2) is None
    assert "did not stop after step 2: it logged up to step 4" in first_run_problem(recs(1, 2, 3, 4), 2)
    assert "ended after step 1, before the stop after step 2" in first_run_problem(recs(1), 2)
    assert "wrote no step" in first_run_problem({}, 2)
    # A second run that logged step 1 again: its records after the stop say so.
    joined_ = joined(recs(1, 2), recs(1, 2, 3, 4), 2, Checkpointed(step=2))
    assert [(r.step, r.resumed_from, r.checkpoint_step) for r in joined_[0]] == [
        (1, None, None), (2, None, None), (3, None, 2), (4, None, 2)]

    class Plan:  # the one field read_iteration_file reads
        class case:
            class command:
                class resume:
                    iteration_file = "{arm_dir}/latest_checkpointed_iteration.txt"

    assert read_iteration_file(Plan, {"arm_dir": tmp_path}).problem.endswith(
        "cannot be read after the first run (No such file or directory)")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release\n")
    assert "'release' is not an iteration number" in read_iteration_file(
        Plan, {"arm_dir": tmp_path}).problem
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("10\n")
    assert read_iteration_file(Plan, {"arm_dir": tmp_path}).step == 10
