"""Arm cases: the configurations a case's arms run, each derived from the case and preflighted.

An arm is not an option beside its case but a :class:`~harness.spec.schema.Case` of its own, made
here from the case the user wrote and checked by the same preflight (so a layout rule such as "a CP
size divides the DP x CP ranks of a stage" is written once, in ``harness.spec.layout``):

* :func:`as_fixed_cp` -- the case's data at one fixed CP size (``fixed-cp<N>`` arms);
* :func:`with_execution` -- eager, or slot-shared CUDA graphs in one MemPool or in one pool per
  CP size (``graph``, ``graph-separate-pools``, ``graph-fixed-cp<N>``);
* :func:`as_reference` -- the case's model, data and training on one rank, eager, with dynamic
  shapes (``reference``);
* :func:`with_microbatches` -- an arm at a given microbatch count (``graph-mb<M>``);
* :func:`interrupted` -- an arm the harness stops after a step and resumes (``<arm>-resumed``).

A derived arm case is an :class:`~harness.spec.schema.ArmCase`: the parent's id and shape, its
``arm`` (the configuration's name) and ``execution``, and no ``compare`` section (pairs belong to
the user's case). :class:`ArmSpec` names what one arm runs and :func:`derive_arm_case` derives its
case. One derivation is of a whole case, before its arms are planned:

* :func:`as_emulated` -- the case with chosen ranks emulated (``emulate.ranks``; what
  ``--emulate-ranks`` makes): its id, pairs and everything else stay the case's;
* :func:`as_emulated_instead` -- what a local run on too few GPUs runs instead of skipping a case
  (``launch.ranks.placement.emulated_instead``): its ends emulated for at most
  :func:`emulated_steps` steps (:func:`with_steps`). ``gate`` re-derives both from the case file
  to check that a sweep ran the case the file defines (``harness.trust.stored_plan``).

Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, TypeVar, Union

from harness.errors import CaseError
from harness.spec.names import (
    DCP,
    EAGER,
    FIXED_CP_KINDS,
    GRAPH,
    GRAPH_FIXED_CP,
    MICROBATCHES_INFIX,
    ORACLE,
    REFERENCE,
    REPEAT_SUFFIX,
    RESUMED_SUFFIX,
    SEPARATE_POOLS,
    ArmKind,
)
from harness.spec.preflight import preflight, reference_layout_problem
from harness.spec.schema import ArmCase, BaseCase, Case, EmulateSpec, Execution, Pools

AnyCase = Union[Case, ArmCase]
_C = TypeVar("_C", Case, ArmCase)


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
    # The one-rank case trained beside Hugging Face's Qwen3-MoE (``compare.oracle``): arm ``oracle``
    oracle: bool = False

    @property
    def base(self) -> str:
        """The configuration's name (the derived case's ``arm``)."""
        if self.oracle:
            return ORACLE_ARM
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


ORACLE_ARM = ORACLE


def has_graph_arms(case: BaseCase) -> bool:
    """Whether ``case`` can have graph arms: a ``graphs:`` section, or a command case's
    ``command.arms.graph`` arguments."""
    return case.graphs is not None or (case.command is not None and GRAPH in case.command.arms)


def derive_arm_case(case: Case, spec: ArmSpec) -> ArmCase:
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
    if spec.oracle:
        derived = derived.model_copy(update={
            "execution": derived.execution.model_copy(update={"oracle": True})})
    if spec.repeat or spec.kind == REFERENCE:  # what must not matter, varied (Execution)
        derived = derived.model_copy(update={
            "execution": derived.execution.model_copy(update={"vary_processes": True})})
    return derived


def _checked(parent: AnyCase, derived: _C, field: str, what: str) -> _C:
    problems = preflight(derived)
    if problems:
        listed = "; ".join(f"{p.field or 'case'}: {p.message}" for p in problems)
        raise CaseError(f"{what} cannot run: {listed}", file=parent.source, case=parent.id,
                        field=field)
    return derived


def _derive(case: AnyCase, arm: str, **changes: object) -> ArmCase:
    """An arm's case from ``case`` (a user's case or an arm's): its sections, ``changes`` and the
    arm's name; a user's case's pairs (``compare``) stay behind."""
    data = case.model_dump(mode="python", exclude={"compare"})
    data.update(changes)
    data["arm"] = arm
    return ArmCase.model_validate(data)


def as_fixed_cp(case: AnyCase, cp: int, arm: str,
                field: str = "compare.dcp_vs_fixed_cp.fixed_cp") -> ArmCase:
    """The case's data with every microbatch at CP size ``cp`` (``parallel.cp``; the dynamic-CP
    fields dropped): its layout is ``case.layout.at_fixed_cp(cp)``. Its per-rank token buffer is
    ``seq_length / cp`` in static-shape mode."""
    par = case.parallel.model_copy(update={"cp": cp, "dynamic_cp": None})
    train = case.train.model_copy(update={"max_seqlen_per_rank": None})
    derived = _derive(case, arm, parallel=par, train=train)
    return _checked(case, derived, field, f"arm '{arm}' (the case at fixed CP {cp})")


def with_execution(case: AnyCase, arm: str, graphed: bool,
                   pools: Pools = Pools.SHARED) -> ArmCase:
    """The case run eagerly (``graphed=False``) or with slot-shared CUDA graphs (needs a
    ``graphs:`` section), every CP variant in one MemPool (``shared``) or one per CP size."""
    if graphed and case.graphs is None and case.command is None:  # a command: command.arms.graph
        raise CaseError(f"arm '{arm}' runs CUDA graphs: add a `graphs:` section (e.g. "
                        "{scope: attn, warmup_steps: 2})", file=case.source, case=case.id,
                        field="graphs")
    derived = _derive(case, arm, execution=Execution(graphed=graphed, pools=pools))
    return _checked(case, derived, "graphs" if graphed else "compare", f"arm '{arm}'")


def as_reference(case: Case, arm: str = REFERENCE, field: str = "compare.reference") -> ArmCase:
    """The case's model, data and training on ONE rank: ``pp = vpp = ep = 1``, no CP or dynamic
    CP, one node with one rank, eager, and the ordinary dynamic-shape path (no ``graphs:``, no
    ``shapes:``): in a static-shape case every other arm runs the static-shape path (fixed buffers, device-side metadata,
    varlen attention, static MoE), so a fault there that all of them share still differs from
    this arm. The step's global batch is the same, so the single rank packs every sequence of the
    step into bins of ``train.seq_length`` tokens as a fixed-CP layout without DP does: the same
    microbatches whenever the count is the same (``train.microbatches`` is kept; set it in a
    PP/VPP case whose schedule would otherwise raise the count)."""
    why = reference_layout_problem(case)
    if why is not None:
        raise CaseError(why, file=case.source, case=case.id, field=field)
    par = case.parallel.model_copy(update={"pp": 1, "vpp": 1, "ep": 1, "cp": None, "dynamic_cp": None,
                                           "microbatch_group": None})
    train = case.train.model_copy(update={"max_seqlen_per_rank": None})
    res = case.resources.model_copy(update={"nodes": 1, "gpus_per_node": 1})
    derived = _derive(case, arm, parallel=par, train=train, resources=res, graphs=None,
                      shapes=None, execution=Execution(graphed=False), emulate=None)
    return _checked(case, derived, field, f"arm '{arm}' (the case on one rank)")


def with_microbatches(case: ArmCase, microbatches: int, arm: str,
                      field: str = "compare.slot_ring.microbatches") -> ArmCase:
    """An arm case run at ``microbatches`` per step (``train.microbatches``; the ``graph-mb<M>``
    arms of ``compare.slot_ring``)."""
    train = case.train.model_copy(update={"microbatches": microbatches})
    derived = _derive(case, arm, train=train)
    return _checked(case, derived, field, f"arm '{arm}' (the case at {microbatches} microbatches "
                                          "per step)")


def interrupted(case: ArmCase, after: int, arm: str,
                field: str = "compare.resume.at_step") -> ArmCase:
    """An arm case the harness stops after step ``after`` and starts again from that step's
    checkpoint (``Execution.interrupt_after``; the ``-resumed`` arms of ``compare.resume``)."""
    execution = case.execution.model_copy(update={"interrupt_after": after})
    derived = _derive(case, arm, execution=execution)
    return _checked(case, derived, field, f"arm '{arm}' (stopped after step {after} and resumed)")


def as_emulated(case: Case, ranks: Sequence[int], given: Optional[str] = None) -> Case:
    """``case`` with ``ranks`` emulated: each runs alone on one device as rank r of the case's
    world (``emulate.ranks``; replaces the case's own ``emulate``). ``given`` names where the
    ranks came from in errors (e.g. ``--emulate-ranks 0,15``). The same preflight as a case file
    with that field; a CaseError at ``emulate.ranks`` otherwise."""
    data = case.model_dump(mode="python")
    data["emulate"] = EmulateSpec(ranks=list(ranks))
    derived = Case.model_validate(data)
    what = f"emulated ranks {list(ranks)}" + (f" ({given})" if given else "")
    return _checked(case, derived, "emulate.ranks", what)


# An emulated-instead case trains at most its graph warmup plus this many steps. What emulation
# judges needs no more: graph vs eager is bitwise on every step, the memory probe and the pools
# come with the first graphed steps, and the focused multi-GPU cases replay both CP sizes on every
# graphed step from the first (``<arm>.variants_replayed`` fails a run where one is never
# replayed); their 20 steps serve the loss pairs (reference noise, golden values), which are
# skipped under emulation. The 1-GPU emulated case (cases/focused/gpu1-emulated-*) runs 8.
EMULATED_GRAPHED_STEPS = 6


def emulated_steps(case: Case) -> int:
    """How many steps an emulated-instead run of ``case`` trains: its own count, at most its
    graph warmup plus ``EMULATED_GRAPHED_STEPS`` (see there)."""
    warmup = case.graphs.warmup_steps if case.graphs is not None else 0
    return min(case.train.steps, warmup + EMULATED_GRAPHED_STEPS)


def with_steps(case: Case, steps: int) -> Case:
    """``case`` training ``steps`` steps (its memory probe no later than the last); the case
    itself when it trains that many already."""
    if steps == case.train.steps:
        return case
    probe = case.train.memory_probe_step
    train = {**case.train.model_dump(mode="python"), "steps": steps,
             "memory_probe_step": None if probe is None else min(probe, steps)}
    return Case.model_validate({**case.model_dump(mode="python"), "train": train})


def as_emulated_instead(case: Case, ranks: Sequence[int], given: Optional[str] = None) -> Case:
    """``case`` as a local run on too few GPUs runs it instead of a skip: ``ranks`` emulated, for
    at most :func:`emulated_steps` steps (module doc)."""
    return as_emulated(with_steps(case, emulated_steps(case)), ranks, given)
