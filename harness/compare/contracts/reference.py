"""``reference``: a candidate layout against the single-rank ``reference`` arm
(``compare.reference``), compared where the math says the two must agree.

A regrouping is explained, never assumed. The plan (:meth:`Reference.plan`) says per candidate
whether it regroups tokens (DP, EP over DP, dynamic CP: ``regroup_reason``) or must pack the
single rank's microbatches (PP, VPP, CP, EP inside CP, the fixed-CP arms). Each step record
lists the step's microbatches (``StepRecord.packed``), so the contract sees the groupings:

* a candidate that must pack the single rank's microbatches and packs others at any step fails
  ``microbatches`` (the steps and both counts named), and the exact checks stay on every step;
  only a static-shape candidate (``static_bins``) may pack others, at the steps where the single
  rank's microbatches break its static bounds (padded tokens, ``max_seqs_per_microbatch``);
* a regrouping candidate must hold the same sequences every step (``microbatches``), and the
  detail says why it regroups, from which step, and shows both groupings.

``k = regroup_step(...)`` is the first step with an explained other grouping (None: none);
records without ``packed`` (older sweeps) fall back to comparing microbatch counts."""

from __future__ import annotations

import math
from typing import Callable, Mapping, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field

from harness.results import PackedMicrobatch
from harness.spec.comparisons import CommandRole
from harness.spec.layout import padded_length, sequence_multiple
from harness.spec.names import DCP_VS_FIXED_CP, EAGER, REFERENCE, REFERENCE_CONTRACT, pair_name
from harness.spec.preflight import reference_layout_problem
from harness.spec.problems import Problem, at
from harness.spec.schema import ArmCase, Case, LossBound, Strict, Tolerance
from harness.textfmt import collapse_runs

from ..packing import describe_packing, packed_series
from ..pair import Pair
from ..registry import EMULATED_LOSSES, Comparison, Judged, Planner, SummarySection, register
from ..series import Steps, series_check_on, step_series
from ..verdicts import Check


class ReferenceContract(Strict):
    """Candidate arms against the ``reference`` arm: the same model, data and training on ONE rank
    (pp = vpp = ep = 1, no CP; ``harness.spec.derive.as_reference``). What the math allows is
    compared per candidate (``harness.compare``): until the first step the candidate groups its
    tokens into other microbatches than the single rank (step 1 with DP, EP over DP or dynamic
    CP; for a layout without DP the first step whose microbatch count differs, e.g. raised for
    the interleaved schedule; never, otherwise) every metric must match under ``loss``,
    ``grad_norm``, ``aux_loss``; from that step on the per-microbatch aux loss is not comparable
    and, with the aux loss on, its gradient moves the weights apart, so loss (after that step)
    and grad norm (from it) are compared under ``regrouped_loss`` / ``regrouped_grad_norm``
    (with ``aux_loss_coeff: 0``: still under ``loss`` / ``grad_norm``). Default bounds: measured
    fp32 deterministic CPU noise x 10 (docs/internals.md, "Measured noise"); a bf16 case
    (e.g. a graph case, whose reference arm keeps its static shapes) must declare its own."""

    # Candidate arms; None: the case's eager arm (``dcp`` in a dynamic-CP case) and, with
    # compare.dcp_vs_fixed_cp, its fixed-CP arm.
    arms: Optional[list[str]] = None
    loss: LossBound = Tolerance(max_rel=1e-6)
    grad_norm: LossBound = Tolerance(max_rel=1e-6)
    aux_loss: LossBound = Tolerance(max_rel=1e-6)
    regrouped_loss: LossBound = Tolerance(max_rel=1e-3)
    regrouped_grad_norm: LossBound = Tolerance(max_rel=2e-4)


# The check of the microbatch groupings (a section of summary.md of its own).
GROUPING_CHECK = "microbatches"
# The checks of the per-step metrics (each one's value: the worst relative difference over the
# steps it compares); bench/noise.py reads these from the verdicts.
SERIES_CHECKS = ("loss", "grad_norm", "aux_loss", "loss_regrouped", "grad_norm_regrouped")


class StaticBins(BaseModel):
    """The bounds of a static-shape candidate's fixed-CP bins (``harness.workload.packing``):
    ``seq_length`` padded tokens (sequences padded to a multiple of ``2 * cp``) and at most
    ``max_seqs`` sequences. Its bins are the single rank's wherever those fit them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cp: int = Field(ge=1)
    seq_length: int = Field(ge=1)
    max_seqs: Optional[int] = Field(default=None, ge=1)

    def breaks(self, mb: PackedMicrobatch) -> Optional[str]:
        """Why the single rank's microbatch ``mb`` does not fit one of these bins (None: it
        fits), its sequences padded as the packer pads them (``spec.layout.padded_length``;
        records without the lengths: at most a multiple less one per sequence)."""
        seqs = len(mb.sequences)
        if self.max_seqs is not None and seqs > self.max_seqs:
            return f"{seqs} sequences, above max_seqs_per_microbatch {self.max_seqs}"
        lengths = [n for g in mb.groups for n in g.lengths]
        if len(lengths) == seqs:
            padded, how = sum(padded_length(n, self.cp) for n in lengths), ""
        else:
            padded, how = mb.tokens + (sequence_multiple(self.cp) - 1) * seqs, "up to "
        if padded > self.seq_length:
            return (f"{mb.tokens} tokens, {how}{padded} padded for CP{self.cp}, above "
                    f"seq_length {self.seq_length}")
        return None


class ReferencePairParams(ReferenceContract):
    """A reference pair's settings: the case's ``compare.reference`` bounds plus what the plan
    knows about the candidate: whether its layout groups tokens like the single
    rank (``dp == 1``, no dynamic CP), and if not why (``regroup_reason``); the bounds of its
    static-shape bins (``static_bins``); the aux-loss coefficient."""

    groups_like_reference: bool
    aux_loss_coeff: float = Field(ge=0)
    regroup_reason: Optional[str] = None
    static_bins: Optional[StaticBins] = None


def _grouping(packed: Sequence[PackedMicrobatch]) -> tuple[tuple[tuple[int, ...], ...], ...]:
    return tuple(mb.grouping for mb in packed)


def _held(packed: Sequence[PackedMicrobatch]) -> tuple[tuple[int, ...], int]:
    return tuple(sorted(i for mb in packed for i in mb.sequences)), sum(mb.tokens for mb in packed)


def _counts(steps: Steps) -> dict[int, Optional[float]]:
    return step_series(steps, "microbatches")


def differing_steps(cand: Steps, ref: Steps) -> tuple[list[int], bool]:
    """Steps at which the candidate packs other microbatches than the reference, and whether the
    records carry the microbatches (False: older records, only the counts compared)."""
    a, b = packed_series(cand), packed_series(ref)
    common = sorted(set(a) & set(b))
    if common and all(a[s] and b[s] for s in common):
        return [s for s in common if _grouping(a[s]) != _grouping(b[s])], True
    na, nb = _counts(cand), _counts(ref)
    return [s for s in sorted(set(na) & set(nb)) if na[s] != nb[s]], False


def regroup_step(same_grouping: bool, cand: Steps, ref: Steps,
                 static_bins: Optional[StaticBins] = None) -> Optional[int]:
    """The first step at which the candidate groups tokens into other microbatches than the
    reference for a reason the plan gives: a regrouping layout's first differing step; a static
    candidate's first differing step whose single-rank microbatches break its bins (None: no such
    step; a layout that must pack the single rank's microbatches has none)."""
    differ, composed = differing_steps(cand, ref)
    if not same_grouping:
        if not composed:  # older records: the grouping cannot be seen; from step 1, as then
            return 1
        return differ[0] if differ else None
    explained = _explained(differ, static_bins, packed_series(ref))
    return explained[0] if explained else None


def _explained(differ: Sequence[int], bins: Optional[StaticBins],
               ref: Mapping[int, Sequence[PackedMicrobatch]]) -> list[int]:
    if bins is None:
        return []
    return [s for s in differ if any(bins.breaks(mb) for mb in ref.get(s, ()))]


def _both(step: int, arms: tuple[str, str], a: Mapping[int, Sequence[PackedMicrobatch]],
          b: Mapping[int, Sequence[PackedMicrobatch]]) -> str:
    if not a.get(step) or not b.get(step):
        return ""
    return (f"; step {step}: {arms[0]} {describe_packing(a[step])}; {arms[1]} "
            f"{describe_packing(b[step])}")


def microbatches_check(p: ReferencePairParams, arms: tuple[str, str], data: Mapping[str, Steps]
                       ) -> tuple[Check, Optional[int], str]:
    """The ``microbatches`` check, the regrouping step ``k`` and why (the other checks' detail)."""
    cand, ref = data[arms[0]], data[arms[1]]
    differ, composed = differing_steps(cand, ref)
    a, b = packed_series(cand), packed_series(ref)
    na, nb = _counts(cand), _counts(ref)
    common = sorted(set(na) & set(nb))
    how = "" if composed else " (the records carry no microbatches, only counts compared)"

    def counts(steps: Sequence[int]) -> str:
        def n(v: Optional[float]) -> str:
            return "?" if v is None else str(int(v))
        return ", ".join(f"step {s}: {n(na.get(s))} vs {n(nb.get(s))}" for s in steps[:6]) + (
            f" (+{len(steps) - 6} more)" if len(steps) > 6 else "")

    if not p.groups_like_reference:
        reason = p.regroup_reason or "DP, EP over DP or dynamic CP"
        if not composed:  # older records: the grouping cannot be seen; from step 1, as then
            differ = [s for s in common if s >= 1]
        k = differ[0] if differ else None
        lost = [s for s in sorted(set(a) & set(b)) if a[s] and b[s] and _held(a[s]) != _held(b[s])]
        if k is None:
            why = f"{arms[0]} may regroup tokens ({reason}) but groups them like the single rank on every step"
        else:
            why = (f"{arms[0]} regroups tokens into other microbatches ({reason}), from step {k}")
        if lost:
            check = Check(GROUPING_CHECK, float(len(lost)), 0.0, False,
                          f"{why}; but at step(s) {collapse_runs(lost)} its microbatches do not "
                          f"hold the single rank's sequences and tokens{_both(lost[0], arms, a, b)}")
        else:
            same = "the same sequences every step; " if composed else ""
            shown = _both(k, arms, a, b) if k is not None else ""
            check = Check(GROUPING_CHECK, 0.0, 0.0, True,
                          f"{why}; {same}{len(differ)} of {len(common)} steps grouped otherwise"
                          f"{how}{shown}")
        return check, k, why
    explained = _explained(differ, p.static_bins, b)
    unexplained = [s for s in differ if s not in explained]
    k = explained[0] if explained else None
    must = (f"{arms[0]} must pack the single rank's microbatches (no DP, no dynamic CP"
            + (": static bins hold them where they fit" if p.static_bins is not None else "") + ")")
    if unexplained:
        check = Check(GROUPING_CHECK, float(len(unexplained)), 0.0, False,
                      f"{must} but packs others at step(s) {collapse_runs(unexplained)}{how}: "
                      f"microbatches {arms[0]} vs {arms[1]}: {counts(unexplained)}"
                      f"{_both(unexplained[0], arms, a, b)}")
    elif explained:
        assert p.static_bins is not None and k is not None
        notes = "; ".join(f"step {s}: {next(w for w in map(p.static_bins.breaks, b[s]) if w)}"
                          for s in explained[:3])
        check = Check(GROUPING_CHECK, 0.0, 0.0, True,
                      f"{must}; it packs others at step(s) {collapse_runs(explained)}, where the "
                      f"single rank's microbatches exceed its static bins ({notes}){_both(k, arms, a, b)}")
    else:
        check = Check(GROUPING_CHECK, 0.0, 0.0, True,
                      f"{must}: it does on all {len(common)} steps{how}")
    if k is not None:
        why = f"{arms[0]} packs other microbatches than the single rank from step {k} (static bins)"
    elif differ:
        why = f"{arms[0]} must pack the single rank's microbatches (it does not: see microbatches)"
    else:
        why = f"{arms[0]} groups tokens like the single rank on every step"
    return check, k, why


def check_reference(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    """A candidate layout against the single-rank ``reference`` arm (``compare.reference``).

    ``microbatches`` (module docstring), then with ``k`` its explained regrouping step: loss on
    steps <= k, grad norm and aux loss on steps < k under the exact bounds (the weights are
    identical until step k's update, and step k's LM loss does not depend on the grouping);
    after that loss (steps > k) and grad norm (steps >= k) under the ``regrouped_*`` bounds when
    the aux loss is on (its gradient depends on the grouping), else still under the exact bounds;
    the aux loss from step k is not compared. Without an explained regrouping every step is
    compared under the exact bounds."""
    p: ReferencePairParams = pair.params
    coeff = p.aux_loss_coeff
    arms = pair.two_arms()
    grouping, k, why = microbatches_check(p, arms, data)
    last = math.inf if k is None else k
    drift = coeff > 0

    def check(name: str, key: str, bound: LossBound, keep: Callable[[int], bool], what: str) -> Check:
        steps = [s for s in step_series(data[arms[0]], key) if keep(s)]
        if not steps:
            return Check.not_applicable(name, f"{why}: no step {what}")
        return series_check_on(name, key, data, arms, bound, keep, f"{why}; {what}")

    upto, before = (("every step", "every step") if k is None else
                    ("up to the regrouping", "before the regrouping"))
    checks = [grouping,
              check("loss", "loss", p.loss, lambda s: s <= last, upto)
              if drift else check("loss", "loss", p.loss, lambda s: True, "every step (aux loss off)"),
              check("grad_norm", "grad_norm", p.grad_norm, lambda s: s < last, before)
              if drift else check("grad_norm", "grad_norm", p.grad_norm, lambda s: True,
                                  "every step (aux loss off)"),
              check("aux_loss", "aux_loss", p.aux_loss, lambda s: s < last,
                    before + (" (the per-microbatch aux loss depends on the grouping)"
                              if k is not None else ""))]
    if drift and k is not None:
        checks.append(check("loss_regrouped", "loss", p.regrouped_loss, lambda s: s > k,
                            "after the regrouping (the aux-loss gradient moved the weights)"))
        checks.append(check("grad_norm_regrouped", "grad_norm", p.regrouped_grad_norm,
                            lambda s: s >= k, "from the regrouping"))
    return tuple(checks)


def regrouping(arm: ArmCase) -> tuple[Optional[str], Optional[StaticBins]]:
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


class Reference(Comparison):
    name = REFERENCE_CONTRACT
    settings = ReferenceContract
    order = 50
    judged = {REFERENCE_CONTRACT: Judged(ReferencePairParams, check_reference)}
    summary = SummarySection(
        "Microbatch groupings (reference pairs)",
        "Whether each layout packs the single rank's microbatches or, where it regroups tokens, "
        "why, from which step, and both groupings (sequence indices and real tokens per CP "
        "group).", GROUPING_CHECK)
    emulated_skip = (f"not run for emulated ranks: {EMULATED_LOSSES}; the single-rank reference "
                     "arm trains the real model, so it is not run")

    def rules(self, case: Case, settings: ReferenceContract) -> list[Problem]:
        why = reference_layout_problem(case)
        return [Problem(at("compare.reference"), why)] if why is not None else []

    def command_roles(self, case: Case, settings: ReferenceContract) -> tuple[CommandRole, ...]:
        return (CommandRole(REFERENCE, "the single-rank reference arm runs it"),)

    def plan(self, case: Case, settings: ReferenceContract, planner: Planner) -> list[Pair]:
        """One pair per candidate: ``reference`` (the first), ``reference-<arm>`` (the others)."""
        ref = planner.arm(REFERENCE, "compare.reference")
        pairs = []
        for i, cand in enumerate(self._candidates(case, settings, planner)):
            reason, bins = regrouping(planner.case_of(cand))
            params = ReferencePairParams(**dict(settings), groups_like_reference=reason is None,
                                         aux_loss_coeff=case.model.aux_loss_coeff,
                                         regroup_reason=reason, static_bins=bins)
            pairs.append(Pair(pair_name(REFERENCE_CONTRACT, i, cand), REFERENCE_CONTRACT,
                              (cand, ref), params))
        return pairs

    def _candidates(self, case: Case, settings: ReferenceContract, planner: Planner
                    ) -> tuple[str, ...]:
        """``compare.reference.arms``, else the eager arm and the fixed-CP arm of the
        ``dcp_vs_fixed_cp`` pair."""
        field = "compare.reference.arms"
        if settings.arms is not None:
            names = [planner.arm(a, field) for a in settings.arms]
        else:
            names = [planner.arm(EAGER, "compare.reference")]
            names += [p.arms[1] for p in planner.pairs if p.contract == DCP_VS_FIXED_CP]
        out: list[str] = []
        for name in names:
            if name.startswith(REFERENCE):
                raise self.error(case, field, "the reference arm is not a candidate")
            if name not in out:
                out.append(name)
        return tuple(out)


register(Reference())
