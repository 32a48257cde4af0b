"""Arms and pairs of a case.

An *arm* is one training configuration of a case (eager or CUDA-graphed, dynamic or fixed CP); a
*pair* is two arms plus the contract they must satisfy (``harness.compare``). Both follow from the
case's ``compare:`` section:

* ``repeat``          -> ``<arm>`` and ``<arm>-repeat`` (same options; ``arm`` defaults to ``eager``)
* ``graph_vs_eager``  -> ``graph`` (slot-shared CUDA graphs) and ``eager``
* ``dcp_vs_fixed_cp`` -> ``dcp`` (dynamic CP) and ``fixed-cp<N>`` (the same data at CP size N)

Arms with the same name are run once and shared by the pairs that name them. In a dynamic-CP case
the eager arm *is* the dynamic-CP arm, so ``eager`` is named ``dcp`` there (and runs once, not
twice, when a case has both ``repeat`` and ``dcp_vs_fixed_cp``). A case without pairs runs a single
``eager`` (``dcp``) arm; it still gets the per-arm checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from harness.compare import Pair
from harness.errors import CaseError
from harness.spec.schema import Case
from harness.workload import TrainOptions

EAGER = "eager"
GRAPH = "graph"
DCP = "dcp"
REPEAT_SUFFIX = "-repeat"
_FIXED_CP = re.compile(r"^fixed-cp([1-9][0-9]*)$")


@dataclass(frozen=True)
class Arm:
    """One training configuration of a case; ``name`` is also its results folder."""

    name: str
    options: TrainOptions


def fixed_cp_arm_name(cp: int) -> str:
    return f"fixed-cp{cp}"


def options_for_arm(case: Case, name: str) -> TrainOptions:
    """The :class:`TrainOptions` an arm name stands for (``eager``, ``graph``, ``dcp``,
    ``fixed-cp<N>``, each optionally with ``-repeat``)."""
    base = name[: -len(REPEAT_SUFFIX)] if name.endswith(REPEAT_SUFFIX) else name
    if base == EAGER:
        return TrainOptions(graphs=False, fixed_cp=None)
    if base == GRAPH:
        return TrainOptions(graphs=True, fixed_cp=None)
    if base == DCP:
        if not case.parallel.is_dynamic:
            raise _arm_error(case, "compare", f"arm '{name}' needs dynamic CP (parallel.dynamic_cp)")
        return TrainOptions(graphs=False, fixed_cp=None)
    match = _FIXED_CP.match(base)
    if match:
        return TrainOptions(graphs=False, fixed_cp=int(match.group(1)))
    raise _arm_error(
        case, "compare.repeat.arm",
        f"unknown arm '{name}'; use eager, graph, dcp or fixed-cp<N>",
    )


def canonical_arm_name(case: Case, name: str) -> str:
    """``eager[-repeat]`` of a dynamic-CP case is its ``dcp[-repeat]`` arm (same options)."""
    if case.parallel.is_dynamic and (name == EAGER or name == EAGER + REPEAT_SUFFIX):
        return DCP + name[len(EAGER):]
    return name


def pairs_for_case(case: Case) -> tuple[Pair, ...]:
    """The case's pairs, in a fixed order (repeat, graph_vs_eager, dcp_vs_fixed_cp)."""
    spec = case.compare
    pairs: list[Pair] = []
    if spec.repeat is not None:
        base = canonical_arm_name(case, spec.repeat.arm)
        options_for_arm(case, base)  # validates the name
        pairs.append(_pair("repeat", (base, base + REPEAT_SUFFIX), spec.repeat))
    if spec.graph_vs_eager is not None:
        pairs.append(_pair("graph_vs_eager", (GRAPH, canonical_arm_name(case, EAGER)),
                           spec.graph_vs_eager))
    if spec.dcp_vs_fixed_cp is not None:
        if not case.parallel.is_dynamic:
            raise _arm_error(
                case, "compare.dcp_vs_fixed_cp",
                "dcp_vs_fixed_cp needs a dynamic-CP case: set parallel.dynamic_cp (not parallel.cp)",
            )
        fixed = spec.dcp_vs_fixed_cp.fixed_cp
        pairs.append(_pair("dcp_vs_fixed_cp", (DCP, fixed_cp_arm_name(fixed)), spec.dcp_vs_fixed_cp))
    return tuple(pairs)


def arms_for_case(case: Case) -> tuple[Arm, ...]:
    """Every arm the case's pairs name, each once, in first-use order; ``(eager,)`` without pairs."""
    names: list[str] = []
    for pair in pairs_for_case(case):
        for name in pair.arms:
            if name not in names:
                names.append(name)
    if not names:
        names.append(canonical_arm_name(case, EAGER))
    return tuple(Arm(name=name, options=options_for_arm(case, name)) for name in names)


def arm_by_name(case: Case, name: str) -> Arm:
    """The arm ``name`` of ``case``; a :class:`CaseError` naming the valid arms otherwise."""
    arms = arms_for_case(case)
    for arm in arms:
        if arm.name == name:
            return arm
    valid = ", ".join(a.name for a in arms)
    raise _arm_error(case, "compare", f"case has no arm '{name}' (its arms: {valid})")


def _pair(contract: str, arms: tuple[str, str], spec: Any) -> Pair:
    return Pair(name=contract, contract=contract, arms=arms, params=spec.model_dump(mode="json"))


def _arm_error(case: Case, field: str, message: str) -> CaseError:
    return CaseError(message, file=case.source, case=case.id, field=field)
