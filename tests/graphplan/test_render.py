"""A slot plan as text and JSON (``graphplan.render``, what ``dcp-harness plan`` prints): the
layout line, each rank's order, the counts left out, and with emulated ranks only the stages
they replay, headed by the rank's label."""

from __future__ import annotations

from harness.graphplan.render import PlanNotes, format_counts, plan_json, plan_text
from harness.slotmem.plan import plan_pipeline


def test_a_plan_says_its_layout_ranks_and_the_counts_left_out() -> None:
    plan = plan_pipeline(2, 2, [2, 4], (1, 2), 1, 2)
    text = plan_text(plan, PlanNotes("c", skipped=(3,)), notes=["time on this machine: ~1 s"])
    lines = text.splitlines()
    assert lines[:2] == ["case c", "time on this machine: ~1 s"]
    assert lines[2].startswith("PP 2 x VPP 2, microbatch group 2, CP sizes 1,2 (canonical CP1), "
                               "microbatch counts 2,4")
    assert "  skipped counts the schedule does not allow: 3" in lines
    assert sum(line.startswith("rank ") for line in lines) == 2 and lines[-1] == plan.summary()
    doc = plan_json(plan, PlanNotes("c", skipped=(3,)))
    assert next(iter(doc)) == "case" and doc["summary"]["skipped_counts"] == [3]


def test_emulated_ranks_show_only_the_stages_they_replay() -> None:
    plan = plan_pipeline(2, 1, 4, (1,), 1)
    about = PlanNotes("c", emulated=((3, "rank 3 (pp 1)", 1),))
    text = plan_text(plan, about)
    assert "rank 3 (pp 1): captures and replays the plan of PP rank 1" in text
    assert "rank 1:" in text and "rank 0:" not in text
    assert plan_json(plan, about)["emulated"] == [{"rank": 3, "label": "rank 3 (pp 1)", "pp_rank": 1}]


def test_counts_are_written_as_ranges_and_steps() -> None:
    assert format_counts([8, 16, 24, 32]) == "8..32 step 8"
    assert format_counts([1, 2, 3, 4, 5, 9]) == "1..5,9"
