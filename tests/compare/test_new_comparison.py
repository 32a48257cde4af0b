"""A new comparison is one file: this one. ``Within`` (``compare.within``: the largest loss of
one arm at most ``most``) is written and registered here, and nothing else in the harness is
edited; the case schema takes its section, preflight runs its rule, the planner makes its pair,
the judge runs its check and summary.md lists its figures and its section.

It registers in a fresh process (:func:`main`), so the comparisons of this test session stay the
harness's own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from pydantic import Field

from harness.compare import (Check, Comparison, Judged, Pair, Planner, StoredPair, SummarySection,
                             register)
from harness.compare.series import Steps, step_series
from harness.spec.names import EAGER
from harness.spec.problems import Problem, at
from harness.spec.schema import Case, Strict

REPO = Path(__file__).resolve().parents[2]


class WithinSettings(Strict):
    """The largest loss of one arm is at most ``most``."""

    most: float = Field(gt=0)
    arm: str = EAGER


def check_within(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: WithinSettings = pair.params
    losses = [v for v in step_series(data[pair.arms[0]], "loss").values() if v is not None]
    worst = max(losses)
    return (Check("largest_loss", worst, p.most, worst <= p.most,
                  f"largest loss of {pair.arms[0]}: {worst:g} (at most {p.most:g})"),)


class Within(Comparison):
    name = "within"
    settings = WithinSettings
    order = 90
    judged = {"within": Judged(WithinSettings, check_within, figures=True)}
    summary = SummarySection("Largest losses", "The largest loss of each arm judged.",
                             "largest_loss")

    def rules(self, case: Case, settings: WithinSettings) -> list[Problem]:
        if case.train.steps < 2:
            return [Problem(at("compare.within"), "needs two steps or more")]
        return []

    def plan(self, case: Case, settings: WithinSettings, planner: Planner) -> list[Pair]:
        return [Pair("within", "within", (planner.arm(settings.arm, "compare.within.arm"),),
                     settings)]


CASE = """name: {name}
train: {{steps: {steps}, global_batch: 4, seq_length: 16, lr: 1.0e-3}}
data: {{lengths: {{min: 4, max: 16}}}}
compare: {{within: {within}}}
"""
LOSSES = [2.5, 2.3, 2.2, 2.1]


def main(folder: str) -> None:
    """Register ``Within`` and take two cases through load, preflight, plan, judge and report;
    print what each stage made, as JSON."""
    from harness.arms import plan_case
    from harness.errors import CaseError
    from harness.launch.sweep_folder import finalize_case, prepare_case_dir
    from harness.report import write_reports
    from harness.results import record_json
    from harness.spec import load_cases
    from tests.test_report import write_arm

    register(Within())
    root = Path(folder)
    out: dict[str, object] = {}

    def load(name: str, steps: int, within: str) -> list[Case]:
        path = root / f"{name}.yaml"
        path.write_text(CASE.format(name=name, steps=steps, within=within))
        return load_cases([path])

    for name, within in (("typo", "{mst: 1}"), ("short", "{most: 3.0}")):
        try:
            load(name, 1 if name == "short" else 4, within)
        except CaseError as exc:
            out[name] = str(exc)
    sweep = root / "sweep"
    for name, most in (("low", 3.0), ("high", 2.4)):
        (case,) = load(name, 4, f"{{most: {most}}}")
        plan = plan_case(case)
        out[f"{name}-pairs"] = [record_json(StoredPair.of(p)) for p in plan.pairs]
        case_dir = prepare_case_dir(plan, sweep)
        write_arm(case_dir, "eager", LOSSES, ranks=1)
        out[f"{name}-verdict"] = record_json(finalize_case(case_dir).pairs[0])
    out["summary"] = write_reports(sweep, plots=False).summary.read_text()
    print(json.dumps(out))


def test_a_comparison_in_one_file_is_planned_preflighted_judged_and_summarised(
        tmp_path: Path) -> None:
    code = f"from tests.compare.test_new_comparison import main; main({str(tmp_path)!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # schema: its section, field by field; preflight: its rule at its field
    assert "field 'compare.within.mst'" in out["typo"] and "most" in out["typo"]
    assert "field 'compare.within'" in out["short"] and "needs two steps or more" in out["short"]
    # plan: its pair of the arm it asked for, its settings typed
    assert out["low-pairs"] == [{"name": "within", "contract": "within", "arms": ["eager"],
                                 "params": {"most": 3.0, "arm": "eager"}}]
    # judge: its check, with the arm checks the harness adds
    low, high = out["low-verdict"], out["high-verdict"]
    checks = {c["name"]: c for c in high["checks"]}
    assert low["status"] == "pass" and high["status"] == "fail"
    assert checks["largest_loss"]["value"] == 2.5 and not checks["largest_loss"]["passed"]
    assert checks["eager.steps_complete"]["passed"]
    # summary: its figures and its section
    summary = out["summary"]
    figures, section = summary.split("## Graph and memory figures")[1].split("## Largest losses")
    assert "### low / within (eager)\n- largest_loss: passed (value 2.5, bound 3)" in figures
    assert "- high / within: largest_loss: FAILED (value 2.5, bound 2.4)" in section
