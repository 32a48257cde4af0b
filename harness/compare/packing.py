"""What an arm packed, step by step, against what its case asks for (``<arm>.packing``).

Every step record carries the step's microbatches (``StepRecord.packed``: each CP group's
sequences, by global-batch index, and their real tokens). :func:`packing_check` holds them to the
arm's :class:`PackingRule`, derived from the arm's own case (``CasePlan.packing_rules``):

* the count: ``train.microbatches`` where the packer must honour it (a fixed-CP layout: the
  fixed-CP arms, the reference arm), and always one the pipeline schedule runs
  (``ParallelLayout.microbatch_count_problem``) and the count the record states;
* the packer's rule: every sequence of the step in exactly one microbatch and their tokens the
  step's; each microbatch's CP groups tile the DP x CP pool (``dp`` groups of the fixed CP size,
  or the dynamic sizes); no group empty; each group within its capacity, counted as the packer
  counts it (``spec.layout.padded_length``: sequences padded to a multiple of ``2 x cp``):
  ``cp x max_seqlen_per_rank`` padded tokens per dynamic-CP group, ``train.seq_length`` per
  fixed-CP bin (padded tokens with static shapes, real tokens else), at most
  ``train.max_seqs_per_microbatch`` sequences with static shapes; each group's sequence lengths
  (``PackedGroup.lengths``) add up to its tokens;
* every rank of the arm recorded the same microbatches (the packing is global).

The judge cannot re-run the packer (the data comes from torch generators in the rank
processes), so the greedy fill itself is not re-checked here: the ``reference`` contract compares
each layout's microbatches with the single rank's. Records without ``packed`` (written before it
was recorded) make the check not applicable, saying so; records without the sequences' lengths
fail a capacity counted in padded tokens that their tokens do not settle either way.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from harness.results import PackedGroup, PackedMicrobatch, StepRecord
from harness.spec.layout import ParallelLayout, padded_length, sequence_multiple
from harness.spec.schema import Case
from harness.textfmt import collapse_runs

from .series import Steps, field_of, first_rank_records, records_of
from .verdicts import Check

PACKING = "packing"


@dataclass(frozen=True)
class PackingRule:
    """What an arm's case asks its packer for: its layout, ``train.microbatches`` where the
    packer honours it (fixed CP; None: the derived count), the static-shape sequence cap, and
    whether a fixed-CP bin's capacity counts padded tokens (static shapes; a dynamic-CP group's
    always does)."""

    layout: ParallelLayout
    microbatches: Optional[int] = None
    max_seqs: Optional[int] = None  # static shapes: most sequences one CP group holds
    static: bool = False

    @property
    def padded(self) -> bool:
        """Whether a group's capacity counts padded tokens (the packer's rule)."""
        return self.layout.dynamic or self.static

    def capacity(self, cp: int) -> int:
        """The tokens one CP group of size ``cp`` may hold (padded where :attr:`padded`)."""
        lay = self.layout
        if lay.dynamic and lay.max_seqlen_per_rank:
            return cp * lay.max_seqlen_per_rank
        return lay.seq_length

    def describe(self) -> str:
        count = (f"train.microbatches {self.microbatches}" if self.microbatches is not None
                 else "a count the schedule runs")
        lay = self.layout
        tokens = "padded" if self.padded else "real"
        cap = (f"CP groups of {'/'.join(map(str, lay.cp_sizes))} within cp x max_seqlen_per_rank "
               f"{lay.max_seqlen_per_rank} {tokens} tokens" if lay.dynamic else
               f"{lay.dp} bin(s) of train.seq_length {lay.seq_length} {tokens} tokens at "
               f"CP{lay.max_cp}")
        seqs = f", at most {self.max_seqs} sequences a group" if self.max_seqs is not None else ""
        return f"{count}, every sequence once, {cap}{seqs}"


def packing_rule(case: Case) -> PackingRule:
    """The rule an arm case's packer follows (``harness.workload.packing.plan_step``)."""
    lay = case.layout
    return PackingRule(layout=lay,
                       microbatches=None if lay.dynamic else case.train.microbatches,
                       max_seqs=case.train.max_seqs_per_microbatch if case.static_shapes else None,
                       static=case.static_shapes)


def packed_of(rec: StepRecord) -> tuple[PackedMicrobatch, ...]:
    """A record's microbatches (``StepRecord.packed``; empty for a record written before they
    were recorded)."""
    return tuple(rec.packed)


def packed_series(steps: Steps) -> dict[int, tuple[PackedMicrobatch, ...]]:
    """Step -> the microbatches the lowest rank recorded (:func:`packed_of`)."""
    out: dict[int, tuple[PackedMicrobatch, ...]] = {}
    for rec in first_rank_records(steps):
        step = field_of(rec, "step")
        if isinstance(step, int) and step not in out:
            out[step] = packed_of(rec)
    return out


def describe_packing(packed: Sequence[PackedMicrobatch], most: int = 8) -> str:
    """``3 microbatches: CP2 [0 4] 130 | CP1 [1] 60 + CP1 [2 3] 58 | ...`` (sequence indices and
    real tokens per CP group, microbatches separated by ``|``)."""
    shown = " | ".join(mb.describe() for mb in packed[:most])
    more = f" | ... (+{len(packed) - most})" if len(packed) > most else ""
    return f"{len(packed)} microbatch{'es' if len(packed) != 1 else ''}: {shown}{more}"


def packing_problems(packed: Sequence[PackedMicrobatch], rule: PackingRule, tokens: int
                     ) -> list[str]:
    """The packer's rule (module doc) held against one step's microbatches as the packer gave
    them (preflight packs every step before any arm runs: ``workload.datacheck``), the step holding
    ``tokens`` real tokens; empty: the packing keeps the rule."""
    rec = StepRecord(step=1, microbatches=len(packed), tokens=tokens, packed=tuple(packed))
    return _step_problems(packed, rec, rule)


def _step_problems(packed: Sequence[PackedMicrobatch], rec: Any, rule: PackingRule) -> list[str]:
    lay = rule.layout
    n = len(packed)
    out: list[str] = []
    stated = field_of(rec, "microbatches")
    if isinstance(stated, int) and stated != n:
        out.append(f"the record says {stated} microbatches but lists {n}")
    if rule.microbatches is not None and n != rule.microbatches:
        out.append(f"{n} microbatches where train.microbatches asks for {rule.microbatches}")
    why = lay.microbatch_count_problem(n) if n else "no microbatch"
    if why is not None:
        out.append(f"{n} microbatches, which the schedule cannot run ({why})")
    seen = Counter(i for mb in packed for i in mb.sequences)
    missing = sorted(set(range(lay.global_batch)) - set(seen))
    twice = sorted(i for i, c in seen.items() if c > 1)
    foreign = sorted(i for i in seen if not 0 <= i < lay.global_batch)
    if missing:
        out.append(f"sequence(s) {collapse_runs(missing)} of the {lay.global_batch} in no microbatch")
    if twice:
        out.append(f"sequence(s) {collapse_runs(twice)} in more than one microbatch")
    if foreign:
        out.append(f"sequence index(es) {foreign} outside the global batch of {lay.global_batch}")
    tokens = field_of(rec, "tokens")
    held = sum(mb.tokens for mb in packed)
    if isinstance(tokens, int) and held != tokens:
        out.append(f"the microbatches hold {held} tokens, the step has {tokens}")
    for j, mb in enumerate(packed):
        where = f"microbatch {j}"
        ranks = sum(g.cp for g in mb.groups)
        if ranks != lay.dp_cp:
            out.append(f"{where}: its CP groups cover {ranks} of the {lay.dp_cp} DP x CP ranks")
        for g in mb.groups:
            if g.cp not in lay.cp_sizes:
                out.append(f"{where}: a CP{g.cp} group; the layout runs CP "
                           f"{'/'.join(map(str, lay.cp_sizes))}")
            if not g.sequences:
                out.append(f"{where}: a CP{g.cp} group without a sequence")
            out += _capacity_problems(where, g, rule)
            if rule.max_seqs is not None and len(g.sequences) > rule.max_seqs:
                out.append(f"{where}: {len(g.sequences)} sequences in a CP group, above "
                           f"train.max_seqs_per_microbatch {rule.max_seqs}")
    return out


def _capacity_problems(where: str, g: PackedGroup, rule: PackingRule) -> list[str]:
    """A group above its capacity, counted as the packer counts it (:class:`PackingRule`)."""
    if g.lengths and (len(g.lengths) != len(g.sequences) or sum(g.lengths) != g.tokens):
        return [f"{where}: a CP{g.cp} group lists {len(g.lengths)} sequence lengths adding up to "
                f"{sum(g.lengths)} for its {len(g.sequences)} sequences of {g.tokens} tokens"]
    cap = rule.capacity(g.cp)
    what = (f"cp x max_seqlen_per_rank = {cap}" if rule.layout.dynamic
            else f"train.seq_length {cap}")
    if not rule.padded:
        return ([f"{where}: a CP{g.cp} group of {g.tokens} tokens, above {what}"]
                if g.tokens > cap else [])
    if not g.lengths:  # older records: fits for sure, over for sure, or not known
        most = g.tokens + (sequence_multiple(g.cp) - 1) * len(g.sequences)
        if g.tokens > cap:
            return [f"{where}: a CP{g.cp} group of {g.tokens} tokens, above {what}"]
        return [] if most <= cap else [
            f"{where}: a CP{g.cp} group of {g.tokens} tokens, up to {most} padded, and its "
            f"records name no sequence lengths: whether it fits {what} (padded tokens) cannot "
            "be checked; re-run the arm"]
    padded = sum(padded_length(n, g.cp) for n in g.lengths)
    if padded > cap:
        return [f"{where}: a CP{g.cp} group of {g.tokens} tokens, {padded} padded to multiples "
                f"of {sequence_multiple(g.cp)}, above {what}"]
    return []


def _as_key(packed: Sequence[PackedMicrobatch]) -> tuple[Any, ...]:
    return tuple((tuple(g.cp for g in mb.groups), mb.grouping) for mb in packed)


def packing_check(arm: str, steps: Steps, rule: PackingRule) -> Check:
    """``<arm>.packing``: the arm's microbatches on every step against ``rule`` (module
    docstring); value = the steps with a problem, bound 0; the detail names them."""
    name = f"{arm}.{PACKING}"
    records = first_rank_records(steps)
    if not records:
        return Check.not_applicable(name, "no step recorded")
    if not any(packed_of(r) for r in records):
        return Check.not_applicable(name, "the records carry no microbatches (written before "
                                          "dcp-harness recorded them); re-run the arm")
    problems: dict[int, list[str]] = {}
    counts: list[int] = []
    for rec in records:
        step = field_of(rec, "step")
        packed = packed_of(rec)
        counts.append(len(packed))
        found = (_step_problems(packed, rec, rule) if packed
                 else ["the record lists no microbatches"])
        if found:
            problems.setdefault(step, []).extend(found)
    first = min(steps, key=lambda r: (not steps[r], r))
    mine = {field_of(r, "step"): _as_key(packed_of(r)) for r in steps[first]}
    for rank, rec in records_of(steps):
        step = field_of(rec, "step")
        if rank != first and step in mine and _as_key(packed_of(rec)) != mine[step]:
            problems.setdefault(step, []).append(f"rank {rank} packed other microbatches than "
                                                 f"rank {first}")
    if problems:
        bad = sorted(problems)
        shown = "; ".join(f"step {s}: {', '.join(dict.fromkeys(problems[s]))}" for s in bad[:3])
        more = f" (+{len(bad) - 3} more steps)" if len(bad) > 3 else ""
        return Check(name, float(len(bad)), 0.0, False,
                     f"{len(bad)} of {len(records)} steps do not pack as the case asks "
                     f"({rule.describe()}): {shown}{more}")
    span = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"
    return Check(name, 0.0, 0.0, True, f"{len(records)} steps of {span} microbatches as the case "
                                       f"asks ({rule.describe()})")


PackingRules = Optional[Mapping[str, PackingRule]]
