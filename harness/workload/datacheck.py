"""Preflight of the data: every step of every planned arm packed before any arm runs.

A step's sequences are a pure function of the case's seed, its length distribution and the step
(``workload.data``), and their microbatches of the arm's layout (``workload.packing.plan_step``),
so whether they fit is known before any process starts. :func:`check_packing` packs every step of
every planned arm (arms that pack alike, e.g. an arm and its repeat, once) and turns the packer's
ConfigError into a :class:`~harness.errors.CaseError` naming the file, the case, the field the
message says to change (and its line), the arms and the step: the error a rank would otherwise
raise at that step, minutes into the sweep. The harness's own invariants are its fault, not the
case's (:class:`~harness.errors.HarnessInvariantError`, naming the invariant): a packing that
breaks the packer's rule (``compare.packing.packing_problems``, the rule ``<arm>.packing``
holds the records to: every sequence once, the count, groups that tile the pool within their
capacity), and a refusal of a step that preflight's exact fill rule says packs. Packing needs torch (the seeded lengths): it is
imported on the first call, not with this module.

Time: the packer's cost grows with the square of the global batch (one step on one core, measured
2026-12: 3.5 ms at 64 sequences, 0.15-0.34 s at 1024, 0.8-1.4 s at 2048, 4.5-6 s at 4096), so
each arm packs its first :func:`packed_steps` steps, within ``PACK_UNITS`` (about 3 s an arm); its
ranks pack the others as they run, and ``dcp-harness validate`` shows how many preflight packed.
Every step of the focused suite (0.07 s) and of the GB200 regression cases (1.1 s) is packed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Sequence

from harness.caseplan import CasePlan, PlannedArm
from harness.compare.packing import packing_problems, packing_rule
from harness.errors import CaseError, ConfigError, HarnessInvariantError
from harness.spec.preflight import fixed_fill
from harness.spec.schema import Case, LengthDistribution
from harness.spec.yamlfile import parse_case_yaml

# Preflight's packing budget per arm, in units of ~0.3 us on one core: a step of global batch B
# costs about STEP_UNITS + B ** 2 (measured, module doc), so the budget is about 3 s an arm.
PACK_UNITS = 10_000_000
STEP_UNITS = 10_000
# A case field a packer message names (``train.microbatches=4``, ``raise parallel.dynamic_cp``).
_FIELD = re.compile(r"\b(?:train|data|parallel)(?:\.[a-z_]+)+")


def packing_key(case: Case) -> tuple:
    """What an arm's packing depends on: arms with equal keys pack every step alike."""
    return (case.layout, case.static_shapes, case.train.model_dump_json(),
            case.data.model_dump_json())


def packed_steps(case: Case) -> int:
    """How many steps (from step 1) preflight packs for an arm of ``case``: every step, or as
    many as ``PACK_UNITS`` allows (none for a global batch of more than ~3000 sequences)."""
    return min(case.train.steps, PACK_UNITS // (STEP_UNITS + case.train.global_batch ** 2))


def check_packing(plans: Sequence[CasePlan]) -> None:
    """Pack the steps of every arm of ``plans`` (every step up to :func:`packed_steps`);
    CaseError at the first that cannot be packed (module doc)."""
    from harness.workload.packing import plan_step

    for plan in plans:
        groups: dict[tuple, list[PlannedArm]] = {}
        for arm in plan.arms:
            groups.setdefault(packing_key(arm.case), []).append(arm)
        for arms in groups.values():
            case = arms[0].case
            rule = packing_rule(case)
            for step in range(1, packed_steps(case) + 1):
                try:
                    packed = plan_step(case, step)
                except ConfigError as exc:
                    if preflight_says_it_packs(case):
                        raise HarnessInvariantError(
                            "a case preflight accepts packs every step", (
                                f"{_arms(arms)} step {step}: the packer refused it ({exc}), but "
                                "the microbatch-fill rule, exact for fixed-CP layouts with fixed "
                                "lengths, says it packs (harness.spec.preflight.fixed_fill)"),
                            file=plan.case.source, case=plan.case.id) from None
                    raise packing_error(plan, arms, str(exc)) from None
                wrong = packing_problems(packed.packed(), rule, packed.total_tokens)
                if wrong:
                    raise HarnessInvariantError(
                        "the packer keeps its rule", (
                            f"{_arms(arms)} step {step}: {'; '.join(wrong)} (the rule: "
                            f"{rule.describe()}; harness.workload.packing.plan_step)"),
                        file=plan.case.source, case=plan.case.id)


def preflight_says_it_packs(case: Case) -> bool:
    """Whether preflight's microbatch-fill rule guarantees that every step of the arm case packs:
    it is exact for a fixed-CP layout with fixed lengths (``spec.preflight``), and the case
    passed it. A packer that refuses such a step is broken, whatever its message advises."""
    return (not case.layout.dynamic and case.data.lengths.distribution is LengthDistribution.FIXED
            and not fixed_fill(case, case.layout, ""))


def _arms(arms: Sequence[PlannedArm]) -> str:
    return f"arm{'s' if len(arms) > 1 else ''} " + ", ".join(f"'{a.name}'" for a in arms)


def packing_error(plan: CasePlan, arms: Sequence[PlannedArm], message: str) -> CaseError:
    """The CaseError of a packer ``message`` for ``arms`` of ``plan``: at the field the message
    says to change (the first it names after its last ``;``, else the first it names)."""
    advice = message.rpartition(";")[2]
    named = _FIELD.findall(advice) or _FIELD.findall(message)
    field = named[0] if named else None
    which = ", ".join(f"'{a.name}'" for a in arms)
    case = plan.case
    return CaseError(
        f"arm{'s' if len(arms) > 1 else ''} {which}: {message} (preflight packed the arm's steps "
        f"with train.seed={case.train.seed} before any arm runs)",
        file=case.source, case=case.id, field=field, line=field_line(case, field))


def field_line(case: Case, field: Optional[str]) -> Optional[int]:
    """The line of ``field`` in the case's file (of its matrix values when the matrix sets it;
    else of the nearest enclosing section written); None when the file cannot be read."""
    if field is None:
        return None
    try:
        parsed = parse_case_yaml(Path(case.source).read_text(encoding="utf-8"), case.source)
    except (OSError, UnicodeDecodeError, CaseError):
        return None
    loc = ("matrix", field) if field in case.matrix_values else tuple(field.split("."))
    return parsed.line_of(loc)
