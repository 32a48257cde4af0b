"""The time arms will take, from what earlier arms took (``harness.launch.local.estimate``), and the
time left a sweep shows (``progress.SuiteClock``)."""

import io
import time

import pytest

from harness.arms import plan_case
from harness.launch.local.estimate import estimate_arm, estimate_case, measure_sweep
from harness.launch.local.progress import LineProgress, RichProgress, SuiteClock
from harness.results import ArmOutcome
from harness.spec.loader import load_cases
from tests.launch.timed import FIXED_PER_RUN, STEP_S, finish_arm, finished_sweep


@pytest.fixture
def history(tmp_path, write_case):
    """A finished sweep of a one-rank case with a repeat and one with an interrupted arm."""
    return finished_sweep(tmp_path / "history", [
        write_case("a", compare={"repeat": {}}), write_case("b", compare={"resume": {}})])


def _plan(write_case, name, **sections):
    return plan_case(load_cases([write_case(name, **sections)])[0])


def test_an_arm_measured_before_takes_what_it_took(history):
    sweep, (a, b) = history
    measured = measure_sweep(sweep)
    assert sorted((m.case_id, m.arm) for m in measured) == [
        ("a", "eager"), ("a", "eager-repeat"), ("b", "eager"), ("b", "eager-resumed")]
    one = estimate_arm(a, a.arm("eager"), 0, measured)
    assert one.basis == "measured" and one.seconds == pytest.approx(FIXED_PER_RUN + 3 * STEP_S)
    two_legs = estimate_arm(b, b.arm("eager-resumed"), 0, measured)  # stopped and resumed
    assert two_legs.seconds == pytest.approx(2 * FIXED_PER_RUN + 3 * STEP_S)


def test_a_new_arm_is_estimated_from_arms_of_its_shape(history, write_case):
    sweep, _ = history
    measured = measure_sweep(sweep)
    longer = _plan(write_case, "c", train={"steps": 10})
    est = estimate_arm(longer, longer.arm("eager"), 0, measured)
    assert est.basis == "similar" and "1 cpu rank" in est.detail
    assert est.seconds == pytest.approx(FIXED_PER_RUN + 10 * STEP_S)
    wider = _plan(write_case, "two", resources={"gpus_per_node": 2})
    assert estimate_arm(wider, wider.arm("eager"), 0, measured).seconds is None  # none of 2 ranks
    gpu = _plan(write_case, "gpu", resources={"device": "cuda"})
    skipped = estimate_arm(gpu, gpu.arm("eager"), 0, measured)
    assert (skipped.basis, skipped.seconds) == ("skipped", 0.0) and "no CUDA GPU" in skipped.detail
    on_cuda = estimate_arm(gpu, gpu.arm("eager"), 1, measured)  # here it would run on CUDA:
    assert on_cuda.basis == "unknown"  # CPU figures say nothing about it
    total = estimate_case(longer, 0, measured).total
    assert (total.arms, total.unknown, total.text()) == (1, 0, "~12 s")


def test_an_arm_that_failed_or_left_no_marks_teaches_nothing(tmp_path, write_case):
    sweep, (a,) = finished_sweep(tmp_path / "s", [write_case("a", compare={"repeat": {}})])
    finish_arm(a, "eager", sweep / "a" / "eager", status="failed")
    (sweep / "a" / "eager-repeat" / "phases.rank0.json").unlink()
    assert measure_sweep(sweep) == []
    assert measure_sweep(tmp_path / "nowhere") == []


def test_the_time_left_counts_down_as_arms_finish(history, write_case, tmp_path):
    _, (a, b) = history
    c = _plan(write_case, "c", train={"steps": 10})
    clock = SuiteClock([a, c], gpus=0, history=measure_sweep(history[0]))
    per_a_arm = FIXED_PER_RUN + 3 * STEP_S
    assert clock.left().seconds == pytest.approx(2 * per_a_arm + FIXED_PER_RUN + 10 * STEP_S)
    clock.arm_started(0, "eager")
    finish_arm(a, "eager", tmp_path / "now" / "eager")
    clock.arm_ended(0, "eager", tmp_path / "now" / "eager")
    clock.arm_ended(0, "eager-repeat")  # already complete: nothing learnt, nothing left of it
    assert clock.left().seconds == pytest.approx(FIXED_PER_RUN + 10 * STEP_S)
    assert clock.left_text() == "~12 s left"


def test_the_plain_lines_say_the_time_left_and_never_run_a_skipped_arm(history, write_case,
                                                                         tmp_path):
    _, (a, _b) = history
    gpu = _plan(write_case, "gpu", resources={"device": "cuda"})
    out = io.StringIO()
    p = LineProgress(out, clock=SuiteClock([gpu, a], gpus=0, history=measure_sweep(history[0])))
    p.sweep_started(2)
    p.case_started("gpu", 0, 1)
    p.arm_started("gpu", "eager", tmp_path / "gpu" / "eager", 3)
    p.arm_finished("gpu", "eager", ArmOutcome(status="skipped", detail="needs CUDA"))
    p.case_started("a", 1, 2)
    p.arm_started("a", "eager", tmp_path / "a" / "eager", 3)
    finish_arm(a, "eager", tmp_path / "a" / "eager")
    p.arm_finished("a", "eager", ArmOutcome(status="ok", returncode=0, wall_s=5.0))
    p.close()
    text = out.getvalue()
    assert "gpu / eager: running" not in text and "gpu / eager: skipped: needs CUDA" in text
    assert "[2/2] a / eager: running 3 step(s), ~5 s (log:" in text
    assert "[2/2] a / eager: ok after 5.0 s (returncode 0); ~5 s left" in text


def test_the_live_display_shows_the_time_left(history, tmp_path):
    from rich.console import Console

    _, (a, _b) = history
    buf = io.StringIO()
    p = RichProgress(Console(file=buf, force_terminal=True, width=120),
                     SuiteClock([a], gpus=0, history=measure_sweep(history[0])))
    p.sweep_started(1)
    p.case_started("a", 0, 2)
    p.arm_started("a", "eager", tmp_path / "eager", 3)
    p.arm_finished("a", "eager", ArmOutcome(status="ok", returncode=0, wall_s=5.0))
    time.sleep(0.3)  # a refresh of the live display (10 per second)
    p.close()
    assert "~5 s left" in buf.getvalue()
