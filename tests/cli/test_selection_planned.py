"""``selected_plans(..., planned=)``: the plans are handed over after the planning and before
preflight packs their steps (what ``run`` starts its CPU ranks' warm server beside)."""

from harness.cli import selection
from harness.cli.selection import selected_plans
from tests.launch.cases import write_case_file


def test_planned_sees_every_plan_before_the_packing(tmp_path, monkeypatch):
    folder = tmp_path / "cases"
    write_case_file(folder, "a")
    write_case_file(folder, "b")
    order = []
    real = selection.check_packing
    monkeypatch.setattr(selection, "check_packing",
                        lambda plans: (order.append(("packed", len(plans))), real(plans)))
    plans = selected_plans([str(folder)],
                           planned=lambda plans: order.append(("planned", sorted(p.case_id for p in plans))))
    assert order == [("planned", ["a", "b"]), ("packed", 2)]
    assert sorted(p.case_id for p in plans) == ["a", "b"]
