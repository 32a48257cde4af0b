"""Hand-made sweep folders for report and gate tests: a real case, a plan of the given arms and
pairs (``CasePlan``), written as a sweep writes them (``case.json``, ``plan.json``, the manifest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from harness.caseplan import CasePlan, PlannedArm, case_hash, write_plan
from harness.compare import Pair
from harness.launch.sweep_folder import prepare_case_dir, record_manifest
from harness.results import write_json_atomic
from harness.spec.derive import with_execution
from harness.spec.loader import cases_from_text
from harness.spec.schema import Case


def hand_plan(case_id: str, pairs: Sequence[Pair], arms: Sequence[str], *, steps: int = 4,
              ranks: int = 2, tags: Sequence[str] = ("focused",)) -> CasePlan:
    """A plan of ``arms`` (each the case itself as an arm's case, eager, on every rank) and
    ``pairs``."""
    text = (f"name: {case_id}\ntags: [{', '.join(tags)}]\n"
            f"train: {{steps: {steps}, global_batch: 8, seq_length: 16, lr: 1.0e-3}}\n"
            "data: {lengths: {min: 4, max: 16}}\n"
            f"resources: {{gpus_per_node: {ranks}}}\n")
    (loaded,) = cases_from_text(text, "case.yaml")
    case = loaded.case
    planned = tuple(PlannedArm(a, "eager", with_execution(case, a, graphed=False), ranks,
                               tuple(range(ranks))) for a in arms)
    return CasePlan(case, case_hash(case.model_dump(mode="json")), "case.yaml", planned,
                    tuple(pairs))


def hand_case(sweep: Path, case_id: str, pairs: Sequence[Pair], arms: Sequence[str],
              **kwargs: Any) -> Path:
    """The case folder of :func:`hand_plan`, listed in the sweep's manifest."""
    return prepare_case_dir(hand_plan(case_id, pairs, arms, **kwargs), sweep)


def edit_case(case_dir: Path, **fields: Any) -> None:
    """Change fields of a stored case (e.g. ``expect``) as if the sweep had run it so: case.json,
    plan.json and the manifest stay consistent."""
    from harness.caseplan import read_plan

    plan = read_plan(case_dir)
    case = Case.model_validate({**plan.case.model_dump(mode="json"), **fields})
    new = CasePlan(case, case_hash(case.model_dump(mode="json")), plan.source, plan.arms, plan.pairs)
    write_json_atomic(case_dir / "case.json", case.model_dump(mode="json"))
    write_plan(case_dir, new)
    record_manifest([new], case_dir.parent)
