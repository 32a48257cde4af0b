"""Arms and pairs of a case, planned once: :func:`plan_case` -> :class:`~harness.caseplan.CasePlan`.

An *arm* is one training configuration of a case, its own :class:`~harness.spec.schema.ArmCase`
derived from the case the user wrote and preflighted like it (``harness.spec.derive``); a *pair*
is arms plus the contract they must satisfy, with its typed settings (``harness.compare``). Both
follow from the case's ``compare:`` section: each comparison set there plans its own arms and
pairs (``Comparison.plan``, one module per comparison in ``harness.compare.contracts``), in the
comparisons' order, through a :class:`CasePlanner`, which derives each arm once; arms with the
same name run once and are shared by the pairs that name them. In a dynamic-CP case the eager
arm *is* the dynamic-CP arm, so ``eager`` is named ``dcp`` there. A case without pairs runs a
single ``eager`` (``dcp``) arm; it still gets the per-arm checks. Every arm of a graph case but
the reference runs with static shapes (the eager arms too), so a pair compares like with like.

The names a case file may give an arm (``compare.repeat.arm``, ``compare.reference.arms``,
``compare.golden.arm``) are looked up among the arms the case can have (:func:`arm_catalog`),
each built from the case's own sections; nothing parses a name back into a configuration.

An emulated case (``emulate.ranks``, ``harness.spec.derive.as_emulated``) has the same arms, each
run on the emulated ranks only (every one alone on one device as rank r of the case's world), and
what its pairs judge is decided here, when the plan is made (:func:`emulated_pair`): an emulated
rank's losses are its own local figures (its communication is a loopback), so each rank is
compared with the same rank of the other arm (``Pair.emulated``), the loss sanity checks are not
applicable, and each comparison says which of its pairs are skipped and which of its checks do
not apply (``Comparison.emulated_skip``, ``emulated_not_comparable``), with the reason.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

from harness.caseplan import CasePlan, PlannedArm, case_hash
from harness.compare import (
    ARM_CHECKS_CONTRACT,
    ARM_CHECKS_PAIR,
    EMULATED_LOSSES,
    JUDGED,
    LOSS_SANITY_CHECKS,
    Pair,
    comparison_of,
    comparisons,
)
from harness.errors import CaseError
from harness.metrics import source_fields
from harness.spec.comparisons import settings_of
from harness.spec.deprecations import unused_command_role
from harness.spec.source_facts import not_mapped
from harness.spec.derive import ArmSpec, derive_arm_case, has_graph_arms
from harness.spec.names import (
    REPEAT_ROLE,
    DCP,
    EAGER,
    FIXED_CP,
    GRAPH,
    GRAPH_FIXED_CP,
    REFERENCE,
    REPEAT_SUFFIX,
    SEPARATE_POOLS,
)
from harness.spec.schema import ArmCase, Case


def arm_catalog(case: Case) -> dict[str, ArmSpec]:
    """Every arm ``case`` can have, by the names a case file may use: the eager arm (``eager``,
    named ``dcp`` in a dynamic-CP case, where ``eager`` is an alias of it), ``graph`` and
    ``graph-separate-pools`` with a ``graphs:`` section, ``fixed-cp<N>`` (and
    ``graph-fixed-cp<N>``) for each CP size of a dynamic-CP case and each size a comparison adds
    (``dcp_vs_fixed_cp``'s ``fixed_cp``), ``reference``; each also as ``<name>-repeat``."""
    dynamic = case.layout.dynamic
    specs = [ArmSpec(DCP if dynamic else EAGER)]
    graphed = has_graph_arms(case)
    if graphed:
        specs += [ArmSpec(GRAPH), ArmSpec(SEPARATE_POOLS)]
    if dynamic:
        sizes = set(case.layout.cp_sizes)
        for comparison in comparisons():
            settings = settings_of(case, comparison.name)
            if settings is not None:
                sizes.update(comparison.fixed_cp_sizes(case, settings))
        for cp in sorted(sizes):
            specs.append(ArmSpec(FIXED_CP, cp))
            if graphed:
                specs.append(ArmSpec(GRAPH_FIXED_CP, cp))
    specs.append(ArmSpec(REFERENCE))
    out = {s.name: s for s in specs}
    out.update({s.name + REPEAT_SUFFIX: replace(s, repeat=True) for s in specs})
    if dynamic:  # the eager arm of a dynamic-CP case is its dcp arm
        out[EAGER] = out[DCP]
        out[EAGER + REPEAT_SUFFIX] = out[DCP + REPEAT_SUFFIX]
    return out


def arm_spec(case: Case, name: str, field: Optional[str] = None) -> ArmSpec:
    """The arm ``name`` of :func:`arm_catalog`; otherwise a CaseError naming the arms the case
    can have, at ``field`` (default: the section the arm would need, else ``compare``)."""
    catalog = arm_catalog(case)
    if name in catalog:
        return catalog[name]
    if name.startswith(DCP):
        hint, needs = "; dcp needs dynamic CP (parallel.dynamic_cp)", "parallel.dynamic_cp"
    elif name.startswith(GRAPH):
        hint, needs = "; graph arms need a `graphs:` section (e.g. {scope: attn})", "graphs"
    else:
        hint, needs = "", "compare"
    names = ", ".join(n for n in catalog if not n.endswith(REPEAT_SUFFIX))
    raise _arm_error(case, field or needs, f"unknown arm '{name}'{hint}; this case can have: "
                                           f"{names} (each also as <name>-repeat)")


def arm_case(case: Case, name: str) -> ArmCase:
    """The derived case of one arm ``name`` of :func:`arm_catalog`, for a benchmark that runs an
    arm on its own, outside a sweep (a sweep runs its plan's arms: :func:`plan_case`)."""
    return derive_arm_case(case, arm_spec(case, name))


class CasePlanner:
    """The arms of one case as its comparisons plan them (``harness.compare.Planner``): each arm
    derived once and preflighted (``harness.spec.derive``), and the pairs planned so far."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.derived: dict[str, tuple[ArmSpec, ArmCase]] = {}
        self.pairs: list[Pair] = []

    def arm(self, name: str, field: str) -> str:
        return self.add(arm_spec(self.case, name, field))

    def add(self, spec: ArmSpec) -> str:
        if spec.name not in self.derived:
            self.derived[spec.name] = (spec, derive_arm_case(self.case, spec))
        return spec.name

    def spec_of(self, name: str) -> ArmSpec:
        return self.derived[name][0]

    def case_of(self, name: str) -> ArmCase:
        return self.derived[name][1]


def plan_case(case: Case) -> CasePlan:
    """The case's arms and pairs, each arm derived and preflighted once; pairs in the
    comparisons' order (``harness.compare.comparisons``). Everything a verdict needs is resolved
    here (the case file's path and the golden folder made absolute, the case's golden files
    copied). Raises CaseError (naming the field) for an arm the case cannot have."""
    planner = CasePlanner(case)
    for comparison in comparisons():
        settings = settings_of(case, comparison.name)
        if settings is not None:
            planner.pairs += comparison.plan(case, settings, planner)
    pairs = list(planner.pairs)
    emulated = case.emulate is not None
    world = case.layout.world
    if case.command is not None:
        pairs = [command_pair(p, case) for p in pairs]
    if emulated:
        pairs = [emulated_pair(p, world) for p in pairs]
    names: list[str] = []
    for pair in pairs:
        if pair.skipped is None:  # a pair skipped at plan time runs nothing
            names += [a for a in pair.arms if a not in names]
    if not names:
        names.append(planner.arm(EAGER, "compare"))
        if emulated:  # its arm checks, with the loss sanity checks not applicable
            pairs.append(emulated_pair(Pair(ARM_CHECKS_PAIR, ARM_CHECKS_CONTRACT, tuple(names)),
                                       world))
    if case.command is not None:
        warn_unused_roles(case, [planner.spec_of(n) for n in names])
    arms = tuple(PlannedArm(name=n, kind=planner.spec_of(n).kind, case=planner.case_of(n),
                            world_size=planner.case_of(n).layout.world,
                            ranks=_ranks(planner.case_of(n)), repeat=planner.spec_of(n).repeat)
                 for n in names)
    return CasePlan(case=case, case_hash=case_hash(case.model_dump(mode="json")),
                    source=str(Path(case.source).resolve()), arms=arms, pairs=tuple(pairs))


def warn_unused_roles(case: Case, specs: Sequence[ArmSpec]) -> None:
    """A deprecation warning for each ``command.arms`` role no planned arm runs: its arguments
    are not used (e.g. ``fixed-cp`` beside ``graph``: ``dcp_vs_fixed_cp`` then compares the
    graph arms, ``graph`` against ``graph-fixed-cp<N>``). Earlier releases ignored them in
    silence; ``spec.deprecations`` says where each belongs."""
    assert case.command is not None
    run = {s.kind for s in specs} | ({REPEAT_ROLE} if any(s.repeat for s in specs) else set())
    for role in case.command.arms:
        if role not in run:
            unused_command_role(case.source, case.id, role, case.command.arms, run)


def command_pair(pair: Pair, case: Case) -> Pair:
    """``pair`` of a command case, with the checks whose data its metrics source does not give
    not applicable, each with the reason (never a pass): a series it has no value of, the checks
    its contract makes from the CUDA-graph capture statistics (``Judged.capture_checks``) or from
    the memory probe (``Judged.probe_checks``; only the record API records either), those its
    comparison says the source cannot feed (``Comparison.command_not_applicable``: its own
    command-case rules, in its module), and the packing of the built-in workload's packer (a
    command packs its own batches)."""
    assert case.command is not None
    metrics = case.command.metrics
    has = source_fields(metrics)
    source = f"command.metrics.source {metrics.source}"
    why = {name: not_mapped(metrics, name) for name in ("aux_loss", "grad_norm") if name not in has}
    judged = JUDGED.get(pair.contract)
    if "graph_stats" not in has and judged is not None:
        for name in judged.capture_checks:
            why[name] = (f"the command's metrics ({source}) carry no CUDA-graph capture "
                         "statistics (harness.metrics.StepRecorder records them: graph_stats=)")
    if "memory_probe" not in has and judged is not None:
        for name in judged.probe_checks:
            why[name] = (f"the command's metrics ({source}) carry no memory probe (a rank's "
                         "memory after empty_cache, the whole device's too; "
                         "harness.metrics.StepRecorder records it: memory_probe=)")
    comparison = comparison_of(pair.contract)
    if comparison is not None:  # the comparison's own command-case rules
        why.update(comparison.command_not_applicable(case, pair, has))
    for arm_name in pair.arms:
        why[f"{arm_name}.packing"] = ("a command packs its own batches; the packing rule is the "
                                      "built-in workload's")
    return replace(pair, not_applicable={**pair.not_applicable_checks, **why})


def _ranks(arm_case_: ArmCase) -> tuple[int, ...]:
    """The ranks an arm runs and records on: every rank of its layout, or the emulated ones."""
    return arm_case_.emulated_ranks or tuple(range(arm_case_.layout.world))


_LOCAL_LOSS = "the loss sanity checks do not apply (0 on a rank without the last pipeline stage)"


def emulated_pair(pair: Pair, world: int) -> Pair:
    """``pair`` of a case whose ranks are emulated ranks of a ``world``-rank layout, as the plan
    judges it: each rank against the same rank of the other arm (``Pair.emulated``); skipped
    where its comparison says so (``Comparison.emulated_skip``), else every arm's loss sanity
    checks and the checks its comparison cannot compare (``emulated_not_comparable``) not
    applicable, each with the reason."""
    comparison = comparison_of(pair.contract)
    if comparison is not None and comparison.emulated_skip is not None:
        return replace(pair, emulated=world, skipped=comparison.emulated_skip)
    not_applicable = {f"{a}.{c}": f"{EMULATED_LOSSES}: {_LOCAL_LOSS}"
                      for a in pair.arms for c in LOSS_SANITY_CHECKS}
    if comparison is not None:
        checks, why = comparison.emulated_not_comparable
        not_applicable.update({c: why for c in checks})
    return replace(pair, emulated=world, not_applicable=tuple(sorted(not_applicable.items())))


def plan_cases(cases: Sequence[Case]) -> list[CasePlan]:
    """:func:`plan_case` of each case, in order (the first CaseError stops it)."""
    return [plan_case(case) for case in cases]


def _arm_error(case: Case, field: str, message: str) -> CaseError:
    return CaseError(message, file=case.source, case=case.id, field=field)
