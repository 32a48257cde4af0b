"""Arms and pairs of a case.

An *arm* is one training configuration of a case, itself a :class:`Case` derived from the case the
user wrote and preflighted like it (``harness.spec.derive``); a *pair* is two arms plus the contract
they must satisfy (``harness.compare``). Both follow from the case's ``compare:`` section:

* ``repeat``          -> ``<arm>`` and ``<arm>-repeat`` (same configuration; ``arm`` default ``eager``)
* ``graph_vs_eager``  -> ``graph`` (slot-shared CUDA graphs) and ``eager``
* ``dcp_vs_fixed_cp`` -> ``dcp`` (dynamic CP) and ``fixed-cp<N>`` (the same data at CP size N); in a
  graph case (``graphs:``) both sides run the graphs: ``graph`` and ``graph-fixed-cp<N>``
* ``graph_pools``     -> ``graph`` (one MemPool) and ``graph-separate-pools`` (one pool per CP size)
* ``reference``       -> each candidate arm (default: the eager arm, and the fixed-CP arm of
  ``dcp_vs_fixed_cp``) and ``reference`` (the case on one rank); pairs ``reference`` (the first
  candidate) and ``reference-<arm>`` (the others)
* ``golden``          -> one arm (default ``eager``) against the case's committed golden values

Arms with the same name run once and are shared by the pairs that name them. In a dynamic-CP case
the eager arm *is* the dynamic-CP arm, so ``eager`` is named ``dcp`` there. A case without pairs
runs a single ``eager`` (``dcp``) arm; it still gets the per-arm checks. Every arm of a graph case
runs with static shapes (the eager arms too), so a pair compares like with like.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from harness.compare import AUX_COEFF, GOLDEN_CASE, GOLDEN_DIR, SAME_GROUPING, Pair
from harness.errors import CaseError
from harness.spec.derive import as_fixed_cp, as_reference, with_execution
from harness.spec.schema import Case, Pools

EAGER = "eager"
GRAPH = "graph"
DCP = "dcp"
SEPARATE_POOLS = "graph-separate-pools"
REFERENCE = "reference"
REPEAT_SUFFIX = "-repeat"
_FIXED_CP = re.compile(r"^(graph-)?fixed-cp([1-9][0-9]*)$")


@dataclass(frozen=True)
class Arm:
    """One training configuration of a case; ``name`` is also its results folder and
    ``case`` the derived case it runs (``case.arm == name`` without a ``-repeat`` suffix)."""

    name: str
    case: Case


def fixed_cp_arm_name(cp: int, graphed: bool = False) -> str:
    return f"{'graph-' if graphed else ''}fixed-cp{cp}"


def arm_case(case: Case, name: str) -> Case:
    """The derived case arm ``name`` runs (``eager``, ``dcp``, ``graph``, ``graph-separate-pools``,
    ``fixed-cp<N>``, ``graph-fixed-cp<N>``, each optionally with ``-repeat``); a CaseError naming
    the field when the case cannot have that arm."""
    base = name[: -len(REPEAT_SUFFIX)] if name.endswith(REPEAT_SUFFIX) else name
    if base in (EAGER, DCP):
        if base == DCP and not case.layout.dynamic:
            raise _arm_error(case, "compare", f"arm '{name}' needs dynamic CP (parallel.dynamic_cp)")
        return with_execution(case, base, graphed=False)
    if base == GRAPH:
        return with_execution(case, base, graphed=True)
    if base == SEPARATE_POOLS:
        return with_execution(case, base, graphed=True, pools=Pools.SEPARATE)
    if base == REFERENCE:
        return as_reference(case, base)
    match = _FIXED_CP.match(base)
    if match:
        graphed, cp = match.group(1) is not None, int(match.group(2))
        fixed = as_fixed_cp(case, cp, base)
        return with_execution(fixed, base, graphed=graphed)
    raise _arm_error(
        case, "compare.repeat.arm",
        f"unknown arm '{name}'; use eager, dcp, graph, graph-separate-pools, fixed-cp<N>, "
        "graph-fixed-cp<N> or reference",
    )


def canonical_arm_name(case: Case, name: str) -> str:
    """``eager[-repeat]`` of a dynamic-CP case is its ``dcp[-repeat]`` arm (same configuration)."""
    if case.layout.dynamic and (name == EAGER or name == EAGER + REPEAT_SUFFIX):
        return DCP + name[len(EAGER):]
    return name


def pairs_for_case(case: Case) -> tuple[Pair, ...]:
    """The case's pairs, in a fixed order (repeat, graph_vs_eager, dcp_vs_fixed_cp, graph_pools,
    reference, golden)."""
    spec = case.compare
    pairs: list[Pair] = []
    if spec.repeat is not None:
        base = canonical_arm_name(case, spec.repeat.arm)
        arm_case(case, base)  # validates the name
        pairs.append(_pair("repeat", (base, base + REPEAT_SUFFIX), spec.repeat))
    if spec.graph_vs_eager is not None:
        pairs.append(_pair("graph_vs_eager", (GRAPH, canonical_arm_name(case, EAGER)),
                           spec.graph_vs_eager))
    if spec.dcp_vs_fixed_cp is not None:
        if not case.layout.dynamic:
            raise _arm_error(
                case, "compare.dcp_vs_fixed_cp",
                "dcp_vs_fixed_cp needs a dynamic-CP case: set parallel.dynamic_cp (not parallel.cp)",
            )
        fixed = spec.dcp_vs_fixed_cp.fixed_cp
        graphed = case.graphs is not None
        pairs.append(_pair("dcp_vs_fixed_cp",
                           (GRAPH if graphed else DCP, fixed_cp_arm_name(fixed, graphed)),
                           spec.dcp_vs_fixed_cp))
    if spec.graph_pools is not None:
        pairs.append(_pair("graph_pools", (GRAPH, SEPARATE_POOLS), spec.graph_pools))
    if spec.reference is not None:
        for i, arm in enumerate(reference_candidates(case, pairs)):
            params = {**spec.reference.model_dump(mode="json"),
                      SAME_GROUPING: arm_case(case, arm).layout.dp == 1,
                      AUX_COEFF: case.model.aux_loss_coeff}
            pairs.append(Pair(name="reference" if i == 0 else f"reference-{arm}",
                              contract="reference", arms=(arm, REFERENCE), params=params))
    if spec.golden is not None:
        arm = canonical_arm_name(case, spec.golden.arm)
        arm_case(case, arm)
        params = {**spec.golden.model_dump(mode="json"), "arm": arm,
                  GOLDEN_DIR: str(golden_dir(case)), GOLDEN_CASE: case.id}
        pairs.append(Pair(name="golden", contract="golden", arms=(arm,), params=params))
    return tuple(pairs)


def reference_candidates(case: Case, pairs: Sequence[Pair] = ()) -> tuple[str, ...]:
    """The arms ``compare.reference`` compares with the single-rank arm: ``compare.reference.arms``
    (canonical names), else the eager arm and the fixed-CP arm of the ``dcp_vs_fixed_cp`` pair."""
    spec = case.compare.reference
    assert spec is not None
    if spec.arms is not None:
        names = [canonical_arm_name(case, a) for a in spec.arms]
    else:
        names = [canonical_arm_name(case, EAGER)]
        names += [p.arms[1] for p in pairs if p.contract == "dcp_vs_fixed_cp"]
    out: list[str] = []
    for name in names:
        if name == REFERENCE or name.startswith(REFERENCE + REPEAT_SUFFIX):
            raise _arm_error(case, "compare.reference.arms", "the reference arm is not a candidate")
        arm_case(case, name)  # validates the name
        if name not in out:
            out.append(name)
    return tuple(out)


def golden_dir(case: Case) -> Path:
    """Folder of the case's golden files: ``compare.golden.dir`` relative to the case file's."""
    spec = case.compare.golden
    assert spec is not None
    return Path(case.source).parent / spec.dir


def arms_for_case(case: Case) -> tuple[Arm, ...]:
    """Every arm the case's pairs name, each once, in first-use order; ``(eager,)`` without pairs."""
    names: list[str] = []
    for pair in pairs_for_case(case):
        for name in pair.arms:
            if name not in names:
                names.append(name)
    if not names:
        names.append(canonical_arm_name(case, EAGER))
    return tuple(Arm(name=name, case=arm_case(case, name)) for name in names)


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
