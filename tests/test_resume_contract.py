"""compare.resume on hand-made step records: ``resumed_after`` fails when the step after the stop
was not written by a process that loaded that step's checkpoint, and a graph arm must capture
its graphs again on that step (``recaptured``)."""

from __future__ import annotations

from typing import Optional

from harness.compare import Pair
from tests.records import graph_stats
from tests.test_compare import LOSS, OK, by_name, one, run

AFTER = 2  # the stop: after step 2 of 4
RESUME = Pair("resume", "resume", ("eager-resumed", "eager"), {"after": AFTER})
GRAPH_RESUME = Pair("resume", "resume", ("graph-resumed", "graph"), {"after": AFTER})
STATS = graph_stats(100.0, 100.0, 1)


def resumed(resumed_from: Optional[int] = AFTER, loaded: Optional[int] = AFTER) -> dict:
    """The resumed arm: steps after the stop written by a process resumed after ``resumed_from``
    that loaded a checkpoint holding step ``loaded`` (by its own metadata)."""
    return run(LOSS, at={s: {"resumed_from": resumed_from, "checkpoint_step": loaded}
                         for s in range(AFTER + 1, len(LOSS) + 1)})


def graph_arm(recapture: bool, resumed_from: Optional[int] = None) -> dict:
    """A graph arm: graphed from step 1, capturing on step 1 and (``recapture``) on the step
    after the stop."""
    at = {s: {"graphed": True, "resumed_from": resumed_from if s > AFTER else None,
              "checkpoint_step": resumed_from if s > AFTER else None}
          for s in range(1, len(LOSS) + 1)}
    at[1]["graph_stats"] = STATS
    if recapture:
        at[AFTER + 1]["graph_stats"] = STATS
    return run(LOSS, at=at)


def test_a_resumed_arm_passes_resumed_after() -> None:
    v = one([RESUME], {"eager-resumed": (OK, resumed()), "eager": (OK, run(LOSS))})
    checks = by_name(v.pairs[0])
    assert v.pairs[0].status == "pass", v.pairs[0]
    assert checks["resumed_after"].passed and checks["resumed_after"].value == 0
    assert "recaptured" not in checks  # an eager arm never captured


def test_a_step_after_the_stop_not_from_a_resumed_process_fails_resumed_after() -> None:
    # The arm ran straight through: its step 3 came from the process that started at step 1.
    v = one([RESUME], {"eager-resumed": (OK, resumed(None, None)), "eager": (OK, run(LOSS))})
    entry = v.pairs[0]
    assert entry.status == "fail"
    assert [c.name for c in entry.failed_checks] == ["resumed_after", "loaded_checkpoint"]
    check = entry.failed_checks[0]
    assert check.value == 2  # both ranks
    assert "rank 0: step 3 was written by a process that started from step 1" in check.detail
    assert "(expected: resumed after step 2)" in check.detail
    # Resumed, but from the wrong checkpoint.
    v = one([RESUME], {"eager-resumed": (OK, resumed(1)), "eager": (OK, run(LOSS))})
    check = by_name(v.pairs[0])["resumed_after"]
    assert not check.passed and "resumed after step 1" in check.detail


def test_the_loaded_checkpoints_own_step_is_a_second_independent_guard() -> None:
    v = one([RESUME], {"eager-resumed": (OK, resumed()), "eager": (OK, run(LOSS))})
    check = by_name(v.pairs[0])["loaded_checkpoint"]
    assert check.passed and "loaded a checkpoint holding step 2 (its own metadata)" in check.detail
    # The ranks agreed on step 2's file, but the checkpoint they loaded holds step 1: only the
    # second guard sees it.
    v = one([RESUME], {"eager-resumed": (OK, resumed(AFTER, 1)), "eager": (OK, run(LOSS))})
    entry = v.pairs[0]
    assert entry.status == "fail" and [c.name for c in entry.failed_checks] == ["loaded_checkpoint"]
    check = entry.failed_checks[0]
    assert check.value == 2 and "rank 0: step 3 was written by a process that loaded a " \
                                "checkpoint that holds step 1" in check.detail
    assert "(expected: a checkpoint of step 2)" in check.detail
    # Records that name no loaded checkpoint (a process that loaded none) fail it too.
    v = one([RESUME], {"eager-resumed": (OK, resumed(AFTER, None)), "eager": (OK, run(LOSS))})
    check = by_name(v.pairs[0])["loaded_checkpoint"]
    assert not check.passed and "loaded no checkpoint" in check.detail


def test_an_arm_without_the_step_after_the_stop_fails_every_resume_guard() -> None:
    cut = {r: [rec for rec in recs if rec.step <= AFTER] for r, recs in graph_arm(True).items()}
    v = one([GRAPH_RESUME], {"graph-resumed": (OK, cut), "graph": (OK, graph_arm(False))})
    checks = by_name(v.pairs[0])
    for name in ("resumed_after", "loaded_checkpoint", "recaptured"):
        assert not checks[name].passed and "recorded no step 3" in checks[name].detail


def test_a_graph_arm_that_captured_again_after_the_stop_passes_recaptured() -> None:
    data = {"graph-resumed": (OK, graph_arm(True, AFTER)), "graph": (OK, graph_arm(False))}
    v = one([GRAPH_RESUME], data)
    checks = by_name(v.pairs[0])
    assert v.pairs[0].status == "pass", v.pairs[0]
    assert checks["recaptured"].passed and checks["recaptured"].value == 0
    assert "every rank captured its graphs again on step 3" in checks["recaptured"].detail


def test_a_graph_arm_that_replayed_without_capturing_after_the_stop_fails_recaptured() -> None:
    data = {"graph-resumed": (OK, graph_arm(False, AFTER)), "graph": (OK, graph_arm(False))}
    v = one([GRAPH_RESUME], data)
    entry = v.pairs[0]
    assert entry.status == "fail"
    assert [c.name for c in entry.failed_checks] == ["recaptured"]
    check = entry.failed_checks[0]
    assert check.value == 2
    assert ("rank(s) 0, 1 of arm 'graph-resumed' replayed step 3 without capturing after the "
            "resume") in check.detail
