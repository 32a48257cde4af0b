"""bench/scale.py at a tiny size: its sweep is made of real plans (4 arms of 8 ranks, 20 steps of
records each) with one failing case, and every step it times runs and ends as it should."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.arms import plan_case
from harness.report import load_sweep
from harness.results import read_steps
from harness.spec import load_cases
from tests.benches import load_bench

pytestmark = pytest.mark.slow  # five fresh harness processes on a 2-case sweep (about 20-40 s)


def test_the_case_files_are_the_template_varied_by_name_and_seed(tmp_path: Path) -> None:
    bench = load_bench("scale")
    files = bench.write_case_files(tmp_path, 12)
    assert [f.name for f in files] == ["scale-0000.yaml", "scale-0001.yaml"]
    cases = load_cases([tmp_path])
    assert len(cases) == 12 and len({c.train.seed for c in cases}) == 12
    assert {c.train.steps for c in cases} == {bench.STEPS}
    plan = plan_case(cases[0])
    assert len(plan.arms) == 4 and all(a.ranks == tuple(range(8)) for a in plan.arms)


def test_a_tiny_sweep_runs_every_step(tmp_path: Path) -> None:
    bench = load_bench("scale")
    summary = bench.run_sizes([2], tmp_path / "w", None, None, browser=False)
    new = summary["results"][2]["new"]
    assert {k: v["rc"] for k, v in new.items()} == {
        "validate": 0, "judge": 0, "report": 0, "gate": 1, "history": 0, "record": 0}  # case 0 fails
    assert all(v["wall_s"] > 0 and v["cpu_s"] > 0 and len(v["load"]) == 2 for v in new.values())
    assert summary["within"]  # the targets bind at 1,000 cases only


def test_the_synthesized_sweep_is_judged_as_a_run_would_be(tmp_path: Path) -> None:
    bench = load_bench("scale")
    _, sweep, _ = bench.synthesize(tmp_path, 2)
    for case_dir in sorted(p for p in sweep.iterdir() if p.is_dir()):
        bench_judge(case_dir)
    view = load_sweep(sweep)
    assert not view.problems and len(view.cases) == 2
    failing, passing = view.cases
    assert failing.verdict.status == "fail" and passing.verdict.status == "pass"
    steps = read_steps(sweep / passing.case_id / "graph")
    assert sorted(steps) == list(range(8)) and all(len(r) == bench.STEPS for r in steps.values())


def bench_judge(case_dir: Path) -> None:
    from harness.launch.sweep_folder import finalize_case

    finalize_case(case_dir)
