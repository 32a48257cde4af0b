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

A derived arm case keeps the parent's id and shape; its ``compare`` section is empty (pairs belong
to the parent) and its ``arm`` field names the arm. One derivation is of a whole case, before its
arms are planned:

* :func:`as_emulated` -- the case with chosen ranks emulated (``emulate.ranks``; what
  ``--emulate-ranks`` makes): its id, pairs and everything else stay the case's.

Pure: no torch.
"""

from __future__ import annotations

from typing import Optional, Sequence

from harness.errors import CaseError
from harness.spec.names import REFERENCE
from harness.spec.preflight import preflight, reference_layout_problem
from harness.spec.schema import Case, CompareSpec, EmulateSpec, Execution, Pools


def _checked(parent: Case, derived: Case, field: str, what: str) -> Case:
    problems = preflight(derived)
    if problems:
        listed = "; ".join(f"{p.field or 'case'}: {p.message}" for p in problems)
        raise CaseError(f"{what} cannot run: {listed}", file=parent.source, case=parent.id,
                        field=field)
    return derived


def _derive(case: Case, arm: str, **changes: object) -> Case:
    data = case.model_dump(mode="python")
    data.update(changes)
    data["compare"] = CompareSpec()
    data["arm"] = arm
    return Case.model_validate(data)


def as_fixed_cp(case: Case, cp: int, arm: str, field: str = "compare.dcp_vs_fixed_cp.fixed_cp") -> Case:
    """The case's data with every microbatch at CP size ``cp`` (``parallel.cp``; the dynamic-CP
    fields dropped): its layout is ``case.layout.at_fixed_cp(cp)``. Its per-rank token buffer is
    ``seq_length / cp`` in static-shape mode."""
    par = case.parallel.model_copy(update={"cp": cp, "dynamic_cp": None})
    train = case.train.model_copy(update={"max_seqlen_per_rank": None})
    derived = _derive(case, arm, parallel=par, train=train, execution=case.execution)
    return _checked(case, derived, field, f"arm '{arm}' (the case at fixed CP {cp})")


def with_execution(case: Case, arm: str, graphed: bool,
                   pools: Pools = Pools.SHARED) -> Case:
    """The case run eagerly (``graphed=False``) or with slot-shared CUDA graphs (needs a
    ``graphs:`` section), every CP variant in one MemPool (``shared``) or one per CP size."""
    if graphed and case.graphs is None and case.command is None:  # a command: command.arms.graph
        raise CaseError(f"arm '{arm}' runs CUDA graphs: add a `graphs:` section (e.g. "
                        "{scope: attn, warmup_steps: 2})", file=case.source, case=case.id,
                        field="graphs")
    derived = _derive(case, arm, execution=Execution(graphed=graphed, pools=pools))
    return _checked(case, derived, "graphs" if graphed else "compare", f"arm '{arm}'")


def as_reference(case: Case, arm: str = REFERENCE, field: str = "compare.reference") -> Case:
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


def with_microbatches(case: Case, microbatches: int, arm: str,
                      field: str = "compare.slot_ring.microbatches") -> Case:
    """An arm case run at ``microbatches`` per step (``train.microbatches``; the ``graph-mb<M>``
    arms of ``compare.slot_ring``)."""
    train = case.train.model_copy(update={"microbatches": microbatches})
    derived = _derive(case, arm, train=train, execution=case.execution)
    return _checked(case, derived, field, f"arm '{arm}' (the case at {microbatches} microbatches "
                                          "per step)")


def interrupted(case: Case, after: int, arm: str, field: str = "compare.resume.at_step") -> Case:
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
