"""The completeness check says who wrote an arm's records: a command whose metrics are one series
for every rank (TensorBoard events, Megatron's log lines; written by the rank that logs) is not
"N steps on each of 2 ranks" (``judge.shared_series``, ``arm_checks(shared=...)``); each rank's
own records (the built-in workload, the record API) still are."""

from __future__ import annotations

from pathlib import Path

from harness.arms import plan_case
from harness.compare import arm_checks
from harness.judge import shared_series
from harness.spec import load_cases

from tests.compare import scenarios as sc

CASES = Path(__file__).resolve().parents[1] / "cases" / "command"


def _plan(name: str):
    (case,) = load_cases([CASES / name])
    return plan_case(case)


def test_the_completeness_detail_says_one_series_stands_for_every_rank() -> None:
    tb = shared_series(_plan("trainer-tensorboard.yaml"))
    assert set(tb) == {"eager", "eager-repeat", "graph"}
    assert tb["graph"].where == ("the command's TensorBoard events (tensorboard), written by "
                                 "the one rank that logs (Megatron's last rank)")
    assert (tb["graph"].rank, tb["graph"].writer) == (1, "the last rank, which logs")
    assert "iteration lines the command printed" in shared_series(
        _plan("trainer-megatron-log.yaml"))["eager"].where
    assert shared_series(_plan("builtin-workload.yaml")) == {}  # the record API: every rank's own
    (complete, _, _) = arm_checks("graph", sc.arm(2), 4, 2, shared=tb["graph"])
    assert complete.passed and complete.detail == (
        "4 steps of one series for all 2 rank(s): the command's TensorBoard events "
        "(tensorboard), written by the one rank that logs (Megatron's last rank)")
    (own, _, _) = arm_checks("eager", sc.arm(2), 4, 2)
    assert own.detail == "4 steps on each of 2 rank(s)"


def test_a_one_writer_series_is_blamed_on_the_writer_and_counted_once() -> None:
    """A NaN in a series the last rank logs for both ranks is one NaN, of that rank, not one
    per rank blamed on rank 0; the ranks have no values of their own to compare."""
    tb = shared_series(_plan("trainer-tensorboard.yaml"))["eager"]
    steps = sc.arm(2, s3={"loss": float("nan"), "nan": True})
    _, finite, _ = arm_checks("eager", steps, 4, 2, shared=tb)
    assert not finite.passed and finite.value == 1.0, finite
    assert finite.detail.startswith("first the last rank, which logs (rank 1) step 3"), finite
    _, both, _ = arm_checks("eager", steps, 4, 2)  # each rank's own records: each counted
    assert both.value == 2.0 and "rank 0 step 3" in both.detail
