"""A golden pair whose plan marks a series not applicable (a command's metrics without an aux
loss) records it as such and judges the rest; the golden file need not have it."""

from harness.compare import Pair, evaluate_case
from harness.golden import GoldenCopy, golden_values
from harness.results import ArmOutcome, StepRecord

WHY = "the command's metrics (command.metrics.source tensorboard) have no aux loss"


def golden_pair(doc: dict, not_applicable: dict) -> Pair:
    copy = GoldenCopy(path="/g/c/golden_values_cpu.json", sha256="0" * 64, document=doc)
    return Pair("golden", "golden", ("eager",),
                {"case_id": "c", "golden_dir": "/g", "steps": 3, "step_time": None,
                 "files": {"cpu": copy}}, not_applicable=not_applicable)


def run(loss_at_3: float = 2.0 / 3) -> dict:
    return {0: [StepRecord(step=s, loss=(2.0 / s if s < 3 else loss_at_3), grad_norm=1.0)
                for s in (1, 2, 3)]}


def test_a_series_the_plan_marks_not_applicable_is_not_looked_up() -> None:
    doc = golden_values(run())
    assert "aux loss" not in doc
    ok = evaluate_case("c", [golden_pair(doc, {"aux_loss": WHY})],
                       {"eager": (ArmOutcome(status="ok"), run())}, expected_steps=3,
                       expected_ranks=1).pairs[0]
    checks = {c.name: c for c in ok.checks}
    assert ok.status == "pass" and not checks["aux_loss"].applicable
    assert WHY in checks["aux_loss"].detail and checks["loss"].applicable
    # the other series are still judged: a changed loss fails
    bad = evaluate_case("c", [golden_pair(doc, {"aux_loss": WHY})],
                        {"eager": (ArmOutcome(status="ok"), run(0.7))}, expected_steps=3,
                        expected_ranks=1).pairs[0]
    assert bad.status == "fail" and [c.name for c in bad.failed_checks] == ["loss"]


def test_without_the_mark_a_missing_series_is_an_error_never_a_pass() -> None:
    doc = golden_values(run())
    entry = evaluate_case("c", [golden_pair(doc, {})], {"eager": (ArmOutcome(status="ok"), run())},
                          expected_steps=3, expected_ranks=1).pairs[0]
    assert entry.status == "error"
