"""Arms and pairs of a case, planned once: :func:`plan_case` -> :class:`~harness.caseplan.CasePlan`.

An *arm* is one training configuration of a case, itself a :class:`Case` derived from the case the
user wrote and preflighted like it (``harness.spec.derive``); a *pair* is two arms plus the contract
they must satisfy, with its typed settings (``harness.compare``). Both follow from the case's
``compare:`` section:

* ``repeat``          -> ``<arm>`` and ``<arm>-repeat`` (same configuration; ``arm`` default ``eager``)
* ``graph_vs_eager``  -> ``graph`` (slot-shared CUDA graphs) and ``eager``
* ``dcp_vs_fixed_cp`` -> ``dcp`` (dynamic CP) and ``fixed-cp<N>`` (the same data at CP size N); in a
  graph case (``graphs:``) both sides run the graphs: ``graph`` and ``graph-fixed-cp<N>``
* ``graph_pools``     -> ``graph`` (one MemPool) and ``graph-separate-pools`` (one pool per CP size)
* ``reference``       -> each candidate arm (default: the eager arm, and the fixed-CP arm of
  ``dcp_vs_fixed_cp``) and ``reference`` (the case on one rank, eager, dynamic shapes); pairs
  ``reference`` (the first candidate) and ``reference-<arm>`` (the others)
* ``golden``          -> one arm (default ``eager``) against the case's committed golden values
* ``resume``          -> each arm (default the eager arm, and ``graph`` in a graph case) and
  ``<arm>-resumed``, the same configuration stopped by the harness after ``at_step`` and started
  again from its checkpoint; pairs ``resume`` (the first) and ``resume-<arm>``
* ``slot_ring``       -> ``graph-mb<M>`` per microbatch count M (pair ``slot_ring``: the graph
  pool's bytes, CUDA), and ``slot_ring-plan`` (no arm: the slot planner's figures for every count,
  computed here, on any machine)

Arms with the same name run once and are shared by the pairs that name them. In a dynamic-CP case
the eager arm *is* the dynamic-CP arm, so ``eager`` is named ``dcp`` there. A case without pairs
runs a single ``eager`` (``dcp``) arm; it still gets the per-arm checks. Every arm of a graph case
but the reference runs with static shapes (the eager arms too), so a pair compares like with like;
the reference arm runs the ordinary dynamic-shape path, a check the static arms do not share.

The names a case file may give an arm (``compare.repeat.arm``, ``compare.reference.arms``,
``compare.golden.arm``) are looked up among the arms the case can have (:func:`arm_catalog`),
each built from the case's own sections; nothing parses a name back into a configuration.

An emulated case (``emulate.ranks``, ``harness.spec.derive.as_emulated``) has the same arms, each
run on the emulated ranks only (every one alone on one device as rank r of the case's world), and
what its pairs judge is decided here, when the plan is made (:func:`emulated_pair`): an emulated
rank's losses are its own local figures (its communication is a loopback), so each rank is
compared with the same rank of the other arm (``Pair.emulated``), the loss comparisons between two
layouts (``dcp_vs_fixed_cp``) and the loss sanity checks are not applicable, and the
``reference`` and ``golden`` pairs are skipped with the reason (the reference arm is not run).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

from harness.caseplan import CasePlan, PlannedArm, case_hash
from harness.compare import (
    ARM_CHECKS_CONTRACT,
    ARM_CHECKS_PAIR,
    LOSS_SANITY_CHECKS,
    GoldenPairParams,
    Pair,
    ReferencePairParams,
    ResumePairParams,
    SlotRingPairParams,
    SlotRingPlanParams,
    StaticBins,
)
from harness.errors import CaseError
from harness.golden import snapshot_golden
from harness.metrics import source_fields
from harness.spec.derive import (
    as_fixed_cp,
    as_reference,
    interrupted,
    with_execution,
    with_microbatches,
)
from harness.spec.names import (
    DCP,
    DCP_VS_FIXED_CP,
    EAGER,
    FIXED_CP,
    FIXED_CP_KINDS,
    GOLDEN,
    GRAPH,
    GRAPH_FIXED_CP,
    GRAPH_POOLS,
    GRAPH_VS_EAGER,
    MICROBATCHES_INFIX,
    REFERENCE,
    REFERENCE_CONTRACT,
    REPEAT,
    REPEAT_SUFFIX,
    RESUME,
    RESUMED_SUFFIX,
    SEPARATE_POOLS,
    SLOT_RING,
    SLOT_RING_PLAN,
    SLOT_RING_PLAN_PAIR,
    ArmKind,
    pair_name,
)
from harness.spec.schema import Case, DType, Pools


@dataclass(frozen=True)
class ArmSpec:
    """What one arm runs: its kind (``harness.spec.names.ARM_KINDS``), the CP size of a fixed-CP
    kind, whether it is the second run of a repeat pair, the microbatch count it is held at
    (``compare.slot_ring``) and the step after which the harness stops and resumes it
    (``compare.resume``)."""

    kind: ArmKind
    fixed_cp: Optional[int] = None
    repeat: bool = False
    microbatches: Optional[int] = None
    resumed_at: Optional[int] = None

    @property
    def base(self) -> str:
        """The configuration's name (the derived case's ``arm``)."""
        if self.kind in FIXED_CP_KINDS:
            name = f"{self.kind}{self.fixed_cp}"
        else:
            name = self.kind
        return name + (f"{MICROBATCHES_INFIX}{self.microbatches}" if self.microbatches else "")

    @property
    def name(self) -> str:
        """The arm's name and results folder."""
        return (self.base + (REPEAT_SUFFIX if self.repeat else "")
                + (RESUMED_SUFFIX if self.resumed_at is not None else ""))


def arm_catalog(case: Case) -> dict[str, ArmSpec]:
    """Every arm ``case`` can have, by the names a case file may use: the eager arm (``eager``,
    named ``dcp`` in a dynamic-CP case, where ``eager`` is an alias of it), ``graph`` and
    ``graph-separate-pools`` with a ``graphs:`` section, ``fixed-cp<N>`` (and
    ``graph-fixed-cp<N>``) for each CP size of a dynamic-CP case and ``dcp_vs_fixed_cp``'s
    ``fixed_cp``, ``reference``; each also as ``<name>-repeat``."""
    dynamic = case.layout.dynamic
    specs = [ArmSpec(DCP if dynamic else EAGER)]
    graphed = has_graph_arms(case)
    if graphed:
        specs += [ArmSpec(GRAPH), ArmSpec(SEPARATE_POOLS)]
    if dynamic:
        sizes = set(case.layout.cp_sizes)
        if case.compare.dcp_vs_fixed_cp is not None:
            sizes.add(case.compare.dcp_vs_fixed_cp.fixed_cp)
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


def derive_arm_case(case: Case, spec: ArmSpec) -> Case:
    """The derived case arm ``spec`` runs (passes the same preflight; CaseError naming the field
    otherwise)."""
    base = spec.base
    if spec.kind in (EAGER, DCP):
        derived = with_execution(case, base, graphed=False)
    elif spec.kind == GRAPH:
        derived = with_execution(case, base, graphed=True)
    elif spec.kind == SEPARATE_POOLS:
        derived = with_execution(case, base, graphed=True, pools=Pools.SEPARATE)
    elif spec.kind == REFERENCE:
        derived = as_reference(case, base)
    else:
        assert spec.fixed_cp is not None
        fixed = as_fixed_cp(case, spec.fixed_cp, base)
        derived = with_execution(fixed, base, graphed=spec.kind == GRAPH_FIXED_CP)
    if spec.microbatches is not None:
        derived = with_microbatches(derived, spec.microbatches, base)
    if spec.resumed_at is not None:
        derived = interrupted(derived, spec.resumed_at, base)
    return derived


def arm_case(case: Case, name: str) -> Case:
    """The derived case of one arm ``name`` of :func:`arm_catalog`, for a benchmark that runs an
    arm on its own, outside a sweep (a sweep runs its plan's arms: :func:`plan_case`)."""
    return derive_arm_case(case, arm_spec(case, name))


def golden_dir(case: Case) -> Path:
    """Folder of the case's golden files, absolute: ``compare.golden.dir`` relative to the case
    file's folder (resolved from the current directory, as the case file's path was given)."""
    spec = case.compare.golden
    assert spec is not None
    return (Path(case.source).parent / spec.dir).resolve()


def _deterministic_fp32(arm_case: Case) -> bool:
    """Whether the arm trains deterministically in fp32 (on CPU it repeats bitwise)."""
    return arm_case.train.deterministic and arm_case.train.dtype is DType.FP32


def plan_case(case: Case) -> CasePlan:
    """The case's arms and pairs, each arm derived and preflighted once; pairs in a fixed order
    (repeat, graph_vs_eager, dcp_vs_fixed_cp, graph_pools, reference, golden, resume, slot_ring).
    Everything a
    verdict needs is resolved here: the case file's path and the golden folder made absolute, the
    case's golden files copied (``harness.golden.snapshot_golden``; the only files it reads).
    Raises CaseError (naming the field) for an arm the case cannot have."""
    derived: dict[str, tuple[ArmSpec, Case]] = {}

    def arm(name: str, field: str) -> str:
        """The canonical name of arm ``name`` (derived once, preflighted)."""
        s = arm_spec(case, name, field)
        if s.name not in derived:
            derived[s.name] = (s, derive_arm_case(case, s))
        return s.name

    pairs = _contract_pairs(case, arm, derived)
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
        names.append(arm(EAGER, "compare"))
        if emulated:  # its arm checks, with the loss sanity checks not applicable
            pairs.append(emulated_pair(Pair(ARM_CHECKS_PAIR, ARM_CHECKS_CONTRACT, tuple(names)),
                                       world))
    arms = tuple(PlannedArm(name=n, kind=derived[n][0].kind, case=derived[n][1],
                            world_size=derived[n][1].layout.world,
                            ranks=_ranks(derived[n][1]), repeat=derived[n][0].repeat)
                 for n in names)
    return CasePlan(case=case, case_hash=case_hash(case.model_dump(mode="json")),
                    source=str(Path(case.source).resolve()), arms=arms, pairs=tuple(pairs))


def _contract_pairs(case: Case, arm: Callable[[str, str], str],
                    derived: dict[str, tuple[ArmSpec, Case]]) -> list[Pair]:
    """The pairs of the case's ``compare:`` section, in :func:`plan_case`'s order, their arms
    derived through ``arm`` (name, field -> canonical name) into ``derived``."""
    spec = case.compare
    pairs: list[Pair] = []
    if spec.repeat is not None:
        base = arm(spec.repeat.arm, "compare.repeat.arm")
        pairs.append(Pair(REPEAT, REPEAT, (base, arm(base + REPEAT_SUFFIX, "compare.repeat.arm")),
                          spec.repeat))
    if spec.graph_vs_eager is not None:
        pairs.append(Pair(GRAPH_VS_EAGER, GRAPH_VS_EAGER,
                          (arm(GRAPH, "graphs"), arm(EAGER, "compare.graph_vs_eager")),
                          spec.graph_vs_eager))
    if spec.dcp_vs_fixed_cp is not None:
        if not case.layout.dynamic:
            raise _arm_error(case, "compare.dcp_vs_fixed_cp", "dcp_vs_fixed_cp needs a dynamic-CP "
                             "case: set parallel.dynamic_cp (not parallel.cp)")
        cp, graphed = spec.dcp_vs_fixed_cp.fixed_cp, has_graph_arms(case)
        fixed = ArmSpec(GRAPH_FIXED_CP if graphed else FIXED_CP, cp).name
        field = "compare.dcp_vs_fixed_cp.fixed_cp"
        pairs.append(Pair(DCP_VS_FIXED_CP, DCP_VS_FIXED_CP,
                          (arm(GRAPH if graphed else DCP, field), arm(fixed, field)),
                          spec.dcp_vs_fixed_cp))
    if spec.graph_pools is not None:
        pairs.append(Pair(GRAPH_POOLS, GRAPH_POOLS,
                          (arm(GRAPH, "graphs"), arm(SEPARATE_POOLS, "graphs")), spec.graph_pools))
    if spec.reference is not None:
        ref = arm(REFERENCE, "compare.reference")
        for i, cand in enumerate(_reference_candidates(case, pairs, arm)):
            reason, bins = regrouping(derived[cand][1])
            params = ReferencePairParams(**dict(spec.reference),
                                         groups_like_reference=reason is None,
                                         aux_loss_coeff=case.model.aux_loss_coeff,
                                         regroup_reason=reason, static_bins=bins)
            pairs.append(Pair(pair_name(REFERENCE_CONTRACT, i, cand), REFERENCE_CONTRACT,
                              (cand, ref), params))
    if spec.golden is not None:
        name = arm(spec.golden.arm, "compare.golden.arm")
        where = golden_dir(case)
        params = GoldenPairParams(**{**dict(spec.golden), "arm": name}, case_id=case.id,
                                  golden_dir=str(where), steps=case.train.steps,
                                  files=snapshot_golden(where, case.id),
                                  deterministic_fp32=_deterministic_fp32(derived[name][1]))
        pairs.append(Pair(GOLDEN, GOLDEN, (name,), params))

    if spec.resume is not None:
        pairs += _resume_pairs(case, arm, derived)
    if spec.slot_ring is not None:
        pairs += _slot_ring_pairs(case, derived)
    return pairs


def has_graph_arms(case: Case) -> bool:
    """Whether ``case`` can have graph arms: a ``graphs:`` section, or a command case's
    ``command.arms.graph`` arguments."""
    return case.graphs is not None or (case.command is not None and GRAPH in case.command.arms)


def command_pair(pair: Pair, case: Case) -> Pair:
    """``pair`` of a command case, with the checks whose data its metrics source does not give
    not applicable, each with the reason (never a pass): a series it has no value of, the
    CUDA-graph capture figures (only the record API records them), and the packing of the
    built-in workload's packer (a command packs its own batches)."""
    assert case.command is not None
    metrics = case.command.metrics
    has = source_fields(metrics)
    source = f"command.metrics.source {metrics.source}"
    why = {name: f"the command's metrics ({source}) have no {name.replace('_', ' ')}: map its "
                 f"tag or log key in command.metrics.tags to have it checked"
           for name in ("aux_loss", "grad_norm") if name not in has}
    if "graph_stats" not in has:
        for name in ("capture", "variants_replayed"):
            why[name] = (f"the command's metrics ({source}) carry no CUDA-graph capture "
                         "statistics (harness.metrics.StepRecorder records them: graph_stats=)")
    for arm_name in pair.arms:
        why[f"{arm_name}.packing"] = ("a command packs its own batches; the packing rule is the "
                                      "built-in workload's")
    return replace(pair, not_applicable={**pair.not_applicable_checks, **why})


def _ranks(arm_case_: Case) -> tuple[int, ...]:
    """The ranks an arm runs and records on: every rank of its layout, or the emulated ones."""
    return arm_case_.emulated_ranks or tuple(range(arm_case_.layout.world))


# Why an emulated case does not judge what it does not (said in its verdict entries).
EMULATED_LOSSES = ("an emulated rank's loss and grad norm are its own local figures, not the "
                   "model's: its communication is a loopback (harness/workload/loopback.py)")
_SKIPPED_PAIRS = {
    REFERENCE_CONTRACT: "the single-rank reference arm trains the real model, so it is not run",
    GOLDEN: "golden values are the model's losses",
}
_NOT_COMPARABLE = ("the DCP and fixed-CP arms lay the tokens over other ranks, so their local "
                   "figures differ by more than the model's (the memory checks stand)")
_LOCAL_LOSS = "the loss sanity checks do not apply (0 on a rank without the last pipeline stage)"


def emulated_pair(pair: Pair, world: int) -> Pair:
    """``pair`` of a case whose ranks are emulated ranks of a ``world``-rank layout, as the plan
    judges it: each rank against the same rank of the other arm (``Pair.emulated``);
    ``reference``, ``golden`` and ``resume`` skipped, the loss comparisons of ``dcp_vs_fixed_cp`` and every
    arm's loss sanity checks not applicable, each with the reason."""
    if pair.contract == RESUME:
        return replace(pair, emulated=world,
                       skipped="not run for emulated ranks: the launcher does not stop and "
                               "resume an emulated rank (run the case without emulate.ranks)")
    if pair.contract in _SKIPPED_PAIRS:
        return replace(pair, emulated=world,
                       skipped=f"not run for emulated ranks: {EMULATED_LOSSES}; "
                                     f"{_SKIPPED_PAIRS[pair.contract]}")
    not_applicable = {f"{a}.{c}": f"{EMULATED_LOSSES}: {_LOCAL_LOSS}"
                      for a in pair.arms for c in LOSS_SANITY_CHECKS}
    if pair.contract == DCP_VS_FIXED_CP:
        not_applicable.update({c: f"{EMULATED_LOSSES}: {_NOT_COMPARABLE}"
                               for c in ("loss", "aux_loss", "grad_norm")})
    return replace(pair, emulated=world, not_applicable=tuple(sorted(not_applicable.items())))


def regrouping(arm: Case) -> tuple[Optional[str], Optional[StaticBins]]:
    """Why an arm case groups tokens into other microbatches than the single-rank reference
    (None: it must pack the very same ones), and the bounds of its static-shape bins (which may
    not hold a microbatch the single rank packs). DP gives each DP group a bin of its own (EP
    over DP: expert all-to-alls across them); dynamic CP carves the pool per microbatch; PP,
    VPP, CP and EP inside CP pack the single rank's bins."""
    lay = arm.layout
    if lay.dynamic:
        return (f"dynamic CP {list(lay.cp_sizes)}: each microbatch carves the {lay.dp_cp} DP x CP "
                "ranks into CP groups of their own sequences"), None
    if lay.dp > 1:
        ep = f", EP {lay.ep} over DP" if lay.ep > lay.max_cp else ""
        return f"DP {lay.dp}{ep}: each microbatch packs one bin per DP group", None
    if arm.static_shapes:
        return None, StaticBins(cp=lay.max_cp, seq_length=lay.seq_length,
                                max_seqs=arm.train.max_seqs_per_microbatch)
    return None, None


def plan_cases(cases: Sequence[Case]) -> list[CasePlan]:
    """:func:`plan_case` of each case, in order (the first CaseError stops it)."""
    return [plan_case(case) for case in cases]


def _reference_candidates(case: Case, pairs: list[Pair], arm: Callable[[str, str], str]
                          ) -> tuple[str, ...]:
    """The arms ``compare.reference`` compares with the single-rank arm: ``compare.reference.arms``,
    else the eager arm and the fixed-CP arm of the ``dcp_vs_fixed_cp`` pair."""
    spec = case.compare.reference
    assert spec is not None
    field = "compare.reference.arms"
    if spec.arms is not None:
        names = [arm(a, field) for a in spec.arms]
    else:
        names = [arm(EAGER, "compare.reference")]
        names += [p.arms[1] for p in pairs if p.contract == DCP_VS_FIXED_CP]
    out: list[str] = []
    for name in names:
        if name.startswith(REFERENCE):
            raise _arm_error(case, field, "the reference arm is not a candidate")
        if name not in out:
            out.append(name)
    return tuple(out)


def _resume_pairs(case: Case, arm: Callable[[str, str], str],
                  derived: dict[str, tuple[ArmSpec, Case]]) -> list[Pair]:
    """``compare.resume``: each arm (default the eager arm, and ``graph`` with ``graphs:``) and
    its ``-resumed`` twin (``Execution.interrupt_after``), one pair each."""
    spec = case.compare.resume
    assert spec is not None
    field = "compare.resume.arms"
    wanted = spec.arm_names(case.graphs is not None)
    after = spec.step(case.train.steps)
    pairs: list[Pair] = []
    for name in dict.fromkeys(arm(a, field) for a in wanted):
        twin = replace(derived[name][0], resumed_at=after)
        if twin.name not in derived:
            derived[twin.name] = (twin, derive_arm_case(case, twin))
        params = ResumePairParams(**dict(spec), after=after)
        pairs.append(Pair(pair_name(RESUME, len(pairs), name), RESUME,
                          (twin.name, name), params))
    return pairs


def ring_figures(case: Case) -> list[dict[str, int]]:
    """Per PP rank, what the slot planner gives a graph arm of ``case``: its physical slots and
    its saved-arena and input-grad-arena counts (``slotmem.plan_pipeline``, as the capture plans
    it: ``harness.graphplan``)."""
    from harness.graphplan import case_graph_layout, rank_plans

    out = []
    for rank in range(case.layout.pp):
        (plan,) = rank_plans(case_graph_layout(case, rank), separate=False)
        out.append({"physical_slots": plan.physical_slots, "saved_arenas": plan.saved_colours,
                    "grad_arenas": plan.grad_colours})
    return out


def _slot_ring_pairs(case: Case, derived: dict[str, tuple[ArmSpec, Case]]) -> list[Pair]:
    """``compare.slot_ring``: ``graph-mb<M>`` per count (pair ``slot_ring``, the bytes on CUDA)
    and ``slot_ring-plan`` (no arm: the planner's figures per count, from here)."""
    spec = case.compare.slot_ring
    assert spec is not None
    names, planned = [], []
    for m in spec.microbatches:
        s = ArmSpec(GRAPH, microbatches=m)
        if s.name not in derived:
            derived[s.name] = (s, derive_arm_case(case, s))
        names.append(s.name)
        planned.append({"microbatches": m, "ranks": ring_figures(derived[s.name][1])})
    return [Pair(SLOT_RING_PLAN_PAIR, SLOT_RING_PLAN, (),
                 SlotRingPlanParams(**dict(spec), planned=planned)),
            Pair(SLOT_RING, SLOT_RING, tuple(names),
                 SlotRingPairParams(**dict(spec), counts=list(spec.microbatches)))]


def _arm_error(case: Case, field: str, message: str) -> CaseError:
    return CaseError(message, file=case.source, case=case.id, field=field)
