"""The checks every arm gets, whatever its pairs: completeness, no NaN/Inf, no skipped step
(``arm_checks``), the values every rank must share equal on every rank (``ranks_agree``), and the sanity checks of ``compare.sanity`` (``sanity_checks``: grad norm not
zero, loss moves, no loss spike)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

from harness.spec.schema import SanitySpec
from harness.textfmt import collapse_runs

from .series import Steps, finite_number, fmt_value, records_of, step_series
from .verdicts import Check

COMPLETENESS = "steps_complete"
# The sanity checks on an arm's loss (``<arm>.<name>``); they do not apply to a rank whose loss is
# not the model's (an emulated rank: ``harness.arms``).
LOSS_SANITY_CHECKS = ("loss_moves", "loss_spike")

RankSet = Union[int, Sequence[int]]  # a count (ranks 0..n-1) or the ranks themselves


@dataclass(frozen=True)
class OneWriter:
    """An arm whose records are one series for every rank, written by one rank (a command's
    TensorBoard events or Megatron's log lines, the last rank's): ``where`` it comes from (said
    in the completeness detail), the ``rank`` that writes it and how a detail names that rank
    (``writer``: "the last rank, which logs"). Its series is judged once, on that rank's
    records, and a fault in it is blamed on the writer."""

    where: str
    rank: int
    writer: str

    def name(self, rank: int) -> str:
        """``the last rank, which logs (rank 1)``."""
        return f"{self.writer} (rank {rank})"


def series_view(steps: Steps, shared: Optional[OneWriter],
                rank_name: Optional[Callable[[int], str]] = None
                ) -> tuple[Steps, Callable[[int], str]]:
    """The records a series check reads and how its details name a rank: the writer's records
    alone, named as the writer, for a one-writer arm (each value counted once); every rank's,
    named ``rank k`` (or ``rank_name``), otherwise."""
    if shared is not None:
        return {shared.rank: steps.get(shared.rank, ())}, shared.name
    return steps, rank_name or (lambda r: f"rank {r}")


def arm_checks(
    arm: str,
    steps: Steps,
    expected_steps: Optional[int] = None,
    expected_ranks: Optional[RankSet] = None,
    rank_name: Optional[Callable[[int], str]] = None,
    shared: Optional[OneWriter] = None,
) -> tuple[Check, ...]:
    """The checks every arm gets, named ``<arm>.steps_complete``, ``<arm>.no_nan_inf``,
    ``<arm>.no_skipped_step``. ``expected_ranks``: how many ranks record (0..n-1) or which ones.
    Without ``expected_steps``/``expected_ranks`` the largest step and rank seen in this arm are
    expected. ``rank_name``: how the details name a rank (default ``rank k``). ``shared``: where
    the records come from when one series stands for every rank (a command's TensorBoard events
    or log lines, written by the one rank that logs, :class:`OneWriter`): said in the
    completeness detail instead of "on each of N ranks", and every check reads the writer's
    records alone (a NaN it logged counted once, blamed on it)."""
    ranks = sorted(steps)
    if expected_ranks is None:
        want_ranks: tuple[int, ...] = tuple(range(max(ranks) + 1 if ranks else 1))
    elif isinstance(expected_ranks, int):
        want_ranks = tuple(range(expected_ranks))
    else:
        want_ranks = tuple(expected_ranks)
    n_ranks = len(want_ranks)
    steps, named = series_view(steps, shared, rank_name)
    if shared is not None:
        want_ranks = (shared.rank,)
    seen_steps = [rec.step for _, rec in records_of(steps)]
    n_steps = expected_steps if expected_steps is not None else max(seen_steps, default=0)
    missing: list[str] = []
    duplicates: list[str] = []
    n_missing = 0
    want = set(range(1, n_steps + 1))
    for rank in want_ranks:
        counts = Counter(rec.step for rec in steps.get(rank, ()))
        absent = sorted(want - set(counts))
        n_missing += len(absent)
        if absent:
            missing.append(f"{named(rank)}: " + collapse_runs(absent))
        dup = sorted(s for s, n in counts.items() if n > 1)
        if dup:
            duplicates.append(f"{named(rank)}: " + collapse_runs(dup))
    problems = n_missing + len(duplicates)
    if n_steps == 0:
        detail = f"no step recorded on any of {n_ranks} rank(s)"
        complete = Check(f"{arm}.{COMPLETENESS}", float(n_ranks), 0.0, False, detail)
    else:
        parts = []
        if missing:
            parts.append("missing " + "; ".join(missing))
        if duplicates:
            parts.append("duplicated " + "; ".join(duplicates))
        whole = (f"{n_steps} steps of one series for all {n_ranks} rank(s): {shared.where}"
                 if shared is not None
                 else f"{n_steps} steps on each of {n_ranks} rank(s)")
        detail = ", ".join(parts) if parts else whole
        complete = Check(f"{arm}.{COMPLETENESS}", float(problems), 0.0, problems == 0, detail)

    bad: list[str] = []
    for rank, rec in records_of(steps):
        values = {"loss": rec.loss, "grad_norm": rec.grad_norm, "aux_loss": rec.aux_loss}
        fields = [k for k in ("loss", "grad_norm") if not finite_number(values[k])]
        if rec.aux_loss is not None and not finite_number(rec.aux_loss):
            fields.append("aux_loss")
        if fields:
            bad.append(f"{named(rank)} step {rec.step}: "
                       + ", ".join(f"{k}={values[k]!r}" for k in fields))
        elif rec.nan:
            bad.append(f"{named(rank)} step {rec.step}: nan=true")
    finite = Check(
        f"{arm}.no_nan_inf", float(len(bad)), 0.0, not bad,
        ("first " + bad[0] + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else "")) if bad
        else "loss and grad norm finite on every step",
    )
    skipped = [f"{named(rank)} step {rec.step}" for rank, rec in records_of(steps) if rec.skipped]
    no_skip = Check(
        f"{arm}.no_skipped_step", float(len(skipped)), 0.0, not skipped,
        ("optimizer step skipped at " + ", ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
        if skipped else "no optimizer step skipped",
    )
    return (complete, finite, no_skip)


# The fields every rank of an arm computes from the whole world (the loss and aux loss summed over
# it, the global grad norm, the skip decision that follows from it, the step's microbatch count
# from the one global packing plan, the learning rate) or holds as every rank does (the norm of
# its replica of the weights): bitwise the same on every rank that records them.
SHARED_FIELDS = ("loss", "aux_loss", "grad_norm", "skipped", "microbatches", "lr", "params_norm")
RANKS_AGREE = "ranks_agree"


def _same(a: object, b: object) -> bool:
    """Equal, a NaN equal to a NaN (``no_nan_inf`` judges those)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def ranks_agree(arm: str, steps: Steps, not_applicable: Optional[str] = None) -> Check:
    """``<arm>.ranks_agree``: per step, each of :data:`SHARED_FIELDS` equal on every rank that
    recorded it (a rank that records no value of a field, such as a command whose last rank
    alone writes metrics, is not compared); ``not_applicable``: why the ranks' values are not
    the world's (emulated ranks compute their own local figures)."""
    name = f"{arm}.{RANKS_AGREE}"
    if not_applicable is not None:
        return Check.not_applicable(name, not_applicable)
    by_step: dict[int, dict[int, object]] = {}
    for rank, rec in records_of(steps):
        by_step.setdefault(rec.step, {})[rank] = rec
    bad: list[str] = []
    compared = 0
    for step in sorted(by_step):
        recs = sorted(by_step[step].items())
        for field in SHARED_FIELDS:
            values = {r: v for r, rec in recs if (v := getattr(rec, field)) is not None}
            if len(values) < 2:
                continue
            compared += 1
            first_rank, first = next(iter(values.items()))
            off = [r for r, v in values.items() if not _same(v, first)]
            if off:
                bad.append(f"step {step} {field}: rank {first_rank} {first!r} vs "
                           + ", ".join(f"rank {r} {values[r]!r}" for r in off[:3])
                           + (" ..." if len(off) > 3 else ""))
    if compared == 0:
        return Check.not_applicable(name, "fewer than two ranks recorded any shared value")
    return Check(name, float(len(bad)), 0.0, not bad,
                 ("ranks disagree on a value every rank must share: " + "; ".join(bad[:3])
                  + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else "")) if bad
                 else f"{', '.join(SHARED_FIELDS)} equal on every rank that recorded them "
                      f"({compared} step/field comparisons)")


CP_BALANCE = "cp_balance"


def cp_balance(arm: str, steps: Steps, bound: float) -> Check:
    """``<arm>.cp_balance``: per step and microbatch, the causal attention work of each CP group
    of more than one rank (``StepRecord.attention_work``, every rank's own), max over mean within
    ``bound`` (``compare.sanity.cp_balance``): a split of the sequences over the CP ranks that is
    still correct (every position once) but gives one rank most of the causal work fails here,
    though no loss moves. Not applicable where no CP group has two ranks or no rank recorded its
    work (a command; records written before it was recorded)."""
    name = f"{arm}.{CP_BALANCE}"
    groups: dict[tuple[int, int, int, int], list[tuple[int, int]]] = {}
    for rank, rec in records_of(steps):
        for w in rec.attention_work:
            if w.cp > 1:
                groups.setdefault((rec.step, w.microbatch, w.group, w.cp), []).append((rank, w.work))
    if not groups:
        return Check.not_applicable(name, "no CP group of two or more ranks recorded its "
                                          "attention work")
    worst, where, over = 0.0, "", []
    for (step, mb, start, cp), works in sorted(groups.items()):
        mean = sum(w for _, w in works) / len(works)
        ratio = max(w for _, w in works) / mean if mean > 0 else 1.0
        if ratio > bound:
            over.append(step)
        if ratio > worst:
            worst = ratio
            where = (f"step {step} microbatch {mb}, CP{cp} group at pool rank {start}: work "
                     + ", ".join(f"rank {r} {w}" for r, w in sorted(works)))
    detail = (f"max/mean of the causal attention work over a CP group {worst:.3f} > {bound:g} in "
              f"{len(over)} of {len(groups)} group-microbatches (worst {where}): the CP split "
              "puts the causal work out of balance" if over else
              f"max/mean {worst:.3f} <= {bound:g} over {len(groups)} CP group-microbatches "
              f"(worst {where})")
    return Check(name, worst, bound, not over, detail)


def sanity_checks(arm: str, steps: Steps, spec: SanitySpec,
                  shared: Optional[OneWriter] = None) -> tuple[Check, ...]:
    """``compare.sanity`` on one arm: ``<arm>.grad_norm_nonzero`` (steps, over every rank, whose
    grad norm is exactly 0: nothing learns), ``<arm>.loss_moves`` (steps whose LM loss is within
    ``loss_moves_rel`` of the step before: a dead model repeats ln(vocab) whatever the data; a
    live one never repeats a loss over different data) and ``<arm>.loss_spike`` (the largest
    loss over the lowest loss of the earlier steps, bound ``loss_spike_factor``). Non-finite
    values are the ``no_nan_inf`` check's. ``shared``: a one-writer arm's writer, whose records
    alone are read."""
    out: list[Check] = []
    if spec.cp_balance is not None:
        out.append(cp_balance(arm, steps, spec.cp_balance))
    series, named = series_view(steps, shared)
    if spec.grad_norm_nonzero:
        zero = [f"{named(rank)} step {rec.step}" for rank, rec in records_of(series)
                if finite_number(rec.grad_norm) and rec.grad_norm == 0]
        out.append(Check(
            f"{arm}.grad_norm_nonzero", float(len(zero)), 0.0, not zero,
            ("grad norm exactly 0 (no gradient reaches the parameters) at " + ", ".join(zero[:5])
             + (f" (+{len(zero) - 5} more)" if len(zero) > 5 else "")) if zero
            else "grad norm non-zero on every step"))
    loss = {s: v for s, v in step_series(steps, "loss").items() if v is not None and math.isfinite(v)}
    order = sorted(loss)
    if spec.loss_moves:
        name = f"{arm}.loss_moves"
        if len(order) < 2:
            out.append(Check.not_applicable(name, f"{len(order)} finite loss(es): nothing to move"))
        else:
            still = [b for a, b in zip(order, order[1:])
                     if abs(loss[b] - loss[a]) <= spec.loss_moves_rel * abs(loss[a])]
            out.append(Check(
                name, float(len(still)), 0.0, not still,
                (f"loss did not move (within rel {spec.loss_moves_rel:g} of the step before) at "
                 f"step(s) {collapse_runs(still)}, loss {fmt_value(loss[still[0]])}") if still
                else f"loss moved on each of {len(order) - 1} steps (rel > {spec.loss_moves_rel:g})"))
    if spec.loss_spike_factor is not None:
        name = f"{arm}.loss_spike"
        worst, where, low = None, "", math.inf
        for a, b in zip(order, order[1:]):
            low = min(low, loss[a])
            if low > 0:
                ratio = loss[b] / low
                if worst is None or ratio > worst:
                    worst, where = ratio, f"step {b}: {fmt_value(loss[b])} vs lowest earlier {fmt_value(low)}"
        if worst is None:
            out.append(Check.not_applicable(name, "fewer than 2 positive finite losses"))
        else:
            out.append(Check(name, worst, spec.loss_spike_factor, worst <= spec.loss_spike_factor,
                             f"largest loss / lowest earlier loss: {worst:.4g} at {where}"))
    return tuple(out)
