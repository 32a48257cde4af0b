"""Packing a step's global batch into microbatches of CP groups (fixed or dynamic CP).

The ``pool`` is the DP x CP ranks of one pipeline stage (``case.layout.dp_cp``); every stage carves
it identically. A microbatch tiles the pool with CP groups (contiguous, size-aligned blocks), each
holding whole packed sequences. Every pool rank runs every microbatch, so all ranks of a stage run
the same microbatch count (as the pipeline schedule and EP all-to-alls need).

* Fixed CP ``c``: ``pool / c`` DP groups of ``c`` ranks; sequences go to bins of ``train.seq_length``
  real tokens (longest first, least-loaded bin), the bin count a multiple of DP (or
  ``train.microbatches * dp`` when given); microbatch ``j`` gives bin ``j * dp + i`` to DP group
  ``i``. Bins count real tokens, so the grouping does not depend on ``c`` (CP padding adds at most
  ``2c - 1`` tokens per sequence on top). In static-shape mode a bin is bounded by its padded
  tokens and ``train.max_seqs_per_microbatch`` sequences, but the least-loaded bin is still
  chosen by real tokens: a static layout without DP packs exactly the single rank's microbatches
  whenever those fit its buffers (what the ``reference`` contract relies on).
* Dynamic CP (Megatron's rule): a sequence of ``L`` tokens needs
  ``max(min_cp, next_pow2(ceil(L / max_seqlen_per_rank)))`` ranks (the next allowed size if that one
  is not listed). Microbatches are filled longest first: a sequence opens a group of its size while
  enough ranks are free (spreading work over the pool), else joins the least-loaded open group of at
  least its size with room (``size * max_seqlen_per_rank`` tokens), else waits for the next
  microbatch. Ranks still idle are absorbed by widening the smallest groups to the next allowed size,
  then (where no size fits the gap) by giving them a sequence split off a group that holds several
  (this microbatch's, else an earlier one's), so no DP x CP rank is idle.

Sequences are padded to a multiple of ``2 * cp`` (``spec.layout.padded_length``: load-balanced
CP chunks; ``compare.packing`` checks the capacities with the same rule); padding is masked out of
the loss and the aux loss, so padding never changes the result.
The case's layout (``Case.layout``) is trusted: preflight has checked it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

from harness.errors import ConfigError
from harness.results import PackedGroup, PackedMicrobatch
from harness.spec.layout import padded_length
from harness.spec.schema import Case
from harness.workload.data import Sequence, step_sequences


@dataclass(frozen=True)
class GroupWork:
    """One CP group's share of a microbatch."""

    start: int  # first pool rank of the group
    size: int  # CP size
    sequences: tuple[Sequence, ...]  # ordered by global-batch index

    @property
    def tokens(self) -> int:
        return sum(s.length for s in self.sequences)


@dataclass(frozen=True)
class MicrobatchPlan:
    index: int
    groups: tuple[GroupWork, ...]  # tile pool ranks [0, pool) in order

    def group_of(self, pool_rank: int) -> GroupWork:
        for g in self.groups:
            if g.start <= pool_rank < g.start + g.size:
                return g
        raise ValueError(f"pool rank {pool_rank} is in no CP group of microbatch {self.index}")

    @property
    def cp_sizes(self) -> tuple[int, ...]:
        return tuple(g.size for g in self.groups)


@dataclass(frozen=True)
class StepPlan:
    step: int
    pool: int
    microbatches: tuple[MicrobatchPlan, ...]
    total_tokens: int  # real tokens of the step (the loss is averaged over these)

    @property
    def sequences(self) -> int:
        return sum(len(g.sequences) for mb in self.microbatches for g in mb.groups)

    def packed(self) -> tuple[PackedMicrobatch, ...]:
        """What each microbatch holds, as the step record keeps it (``StepRecord.packed``)."""
        return tuple(PackedMicrobatch(tuple(PackedGroup(g.size, tuple(s.index for s in g.sequences),
                                                        g.tokens, tuple(s.length for s in g.sequences))
                                            for g in mb.groups))
                     for mb in self.microbatches)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def dynamic_cp_need(length: int, sizes: tuple[int, ...], max_seqlen_per_rank: int) -> int:
    """Megatron's CP size for a sequence, rounded up to an allowed size that holds it padded."""
    want = max(min(sizes), next_pow2(-(-length // max_seqlen_per_rank)))
    for s in sizes:
        if s >= want and padded_length(length, s) <= s * max_seqlen_per_rank:
            return s
    raise ConfigError(
        f"a sequence of {length} tokens needs CP > {max(sizes)} at train.max_seqlen_per_rank="
        f"{max_seqlen_per_rank}; raise parallel.dynamic_cp or train.max_seqlen_per_rank"
    )


def plan_step(case: Case, step: int) -> StepPlan:
    """The microbatches of 1-based ``step`` for ``case`` (an arm case: a fixed-CP arm of a
    dynamic-CP case is a fixed-CP case, ``harness.spec.derive.as_fixed_cp``).

    The microbatch count is raised, where needed, to one the interleaved schedule can run (as
    Megatron's ``align_sample_id_groups`` does for dynamic CP). In static-shape mode (graph cases)
    a fixed-CP bin holds ``seq_length`` *padded* tokens (so each rank's share fits its
    ``seq_length / cp`` buffer) and every CP group at most ``train.max_seqs_per_microbatch``
    sequences (the capacity of the metadata buffers)."""
    seqs = step_sequences(case.train, case.data, step)
    layout = case.layout
    pool = layout.dp_cp
    problem = layout.microbatch_count_problem
    if layout.dynamic:
        mbs = _pack_dynamic(case, seqs, pool, step)
        target = len(mbs)
        while problem(len(mbs)) is not None:
            target += 1
            if target > len(seqs):
                raise ConfigError(
                    f"step {step}: {len(seqs)} sequences cannot make a microbatch count the pipeline "
                    f"schedule accepts ({problem(len(mbs))}); raise train.global_batch"
                )
            mbs = _pack_dynamic(case, seqs, pool, step, max_per_microbatch=-(-len(seqs) // target))
    else:
        mbs = _pack_fixed(case, seqs, pool, layout.max_cp, step, problem)
    return StepPlan(step, pool, tuple(mbs), sum(s.length for s in seqs))


def _pack_fixed(
    case: Case,
    seqs: tuple[Sequence, ...],
    pool: int,
    cp: int,
    step: int,
    problem: Callable[[int], Optional[str]],
) -> list[MicrobatchPlan]:
    dp = pool // cp
    cap = case.train.seq_length
    most = _seq_cap(case)
    size = (lambda s: padded_length(s.length, cp)) if case.static_shapes else (lambda s: s.length)
    order = sorted(seqs, key=lambda s: (-s.length, s.index))
    fixed = case.train.microbatches
    total = sum(s.length for s in seqs)
    nbins = fixed * dp if fixed else dp * _ceil_div(_ceil_div(total, cap), dp)  # whole DP rounds
    if fixed and problem(fixed) is not None:
        raise ConfigError(f"train.microbatches={fixed}: {problem(fixed)}")
    while not fixed and problem(nbins // dp) is not None:
        nbins += dp
    while True:
        loads = [0] * nbins  # what the bound counts (static shapes: padded tokens)
        real = [0] * nbins  # what the choice balances: real tokens, as on one rank
        bins: list[list[Sequence]] = [[] for _ in range(nbins)]
        ok = True
        for s in order:
            need = size(s)
            fits = [b for b in range(nbins) if loads[b] + need <= cap and len(bins[b]) < most]
            if not fits:
                ok = False
                break
            b = min(fits, key=lambda i: (real[i], i))
            loads[b] += need
            real[b] += s.length
            bins[b].append(s)
        if ok:
            break
        if fixed:
            raise ConfigError(
                f"step {step}: {len(seqs)} sequences do not fit in train.microbatches={fixed} x dp={dp} "
                f"bins of train.seq_length={case.train.seq_length} tokens; raise train.microbatches"
            )
        nbins += dp
        while problem(nbins // dp) is not None:
            nbins += dp
    if any(not b for b in bins):
        raise ConfigError(
            f"step {step}: {len(seqs)} sequences cannot fill {nbins} microbatch bins (dp={dp}); "
            f"raise train.global_batch or lower train.microbatches"
        )
    out = []
    for j in range(nbins // dp):
        groups = tuple(
            GroupWork(i * cp, cp, tuple(sorted(bins[j * dp + i], key=lambda s: s.index)))
            for i in range(dp)
        )
        out.append(MicrobatchPlan(j, groups))
    return out


def _pack_dynamic(
    case: Case,
    seqs: tuple[Sequence, ...],
    pool: int,
    step: int,
    max_per_microbatch: Optional[int] = None,
) -> list[MicrobatchPlan]:
    sizes = case.layout.cp_sizes
    most = _seq_cap(case)
    msr = case.layout.tokens_per_rank  # max_seqlen_per_rank
    need = {s.index: dynamic_cp_need(s.length, sizes, msr) for s in seqs}
    remaining = sorted(seqs, key=lambda s: (-s.length, s.index))
    filled: list[list[list]] = []  # every microbatch's groups, [size, sequences, padded load]
    while remaining:
        groups: list[list] = []  # [size, sequences, padded load]
        free = pool
        left = []
        taken = 0
        for s in remaining:
            if max_per_microbatch is not None and taken >= max_per_microbatch:
                left.append(s)
                continue
            placed = False
            if need[s.index] <= free:  # spread over idle ranks first
                groups.append([need[s.index], [s], padded_length(s.length, need[s.index])])
                free -= need[s.index]
                placed = True
            for g in sorted(groups, key=lambda g: (g[2] / g[0], g[0])) if not placed else ():
                room = g[0] * msr - g[2]
                if (g[0] >= need[s.index] and padded_length(s.length, g[0]) <= room
                        and len(g[1]) < most):
                    g[1].append(s)
                    g[2] += padded_length(s.length, g[0])
                    placed = True
                    break
            if placed:
                taken += 1
            else:
                left.append(s)
        filled.append(groups)
        free = _widen(groups, free, sizes, msr)
        while free and _split_off(filled, free, need):
            free = _widen(groups, free - groups[-1][0], sizes, msr)
        if free:
            raise ConfigError(
                f"step {step}: microbatch {len(filled) - 1} leaves {free} of {pool} DP x CP ranks idle "
                f"and no allowed CP size {sizes} can absorb them; add {pool} to parallel.dynamic_cp or "
                f"raise train.global_batch"
            )
        remaining = left
    out = []
    for groups in filled:
        groups.sort(key=lambda g: (-g[0], min(s.index for s in g[1])))
        start, works = 0, []
        for size, members, _ in groups:
            works.append(GroupWork(start, size, tuple(sorted(members, key=lambda s: s.index))))
            start += size
        out.append(MicrobatchPlan(len(out), tuple(works)))
    return out


def _seq_cap(case: Case) -> float:
    """Most sequences one CP group may hold in a microbatch (static shapes: the metadata
    buffers' capacity; else unbounded)."""
    cap = case.train.max_seqs_per_microbatch
    return cap if cap is not None and case.static_shapes else math.inf


def _split_off(filled: list[list[list]], free: int, need: dict[int, int]) -> bool:
    """Give idle ranks of the last microbatch a sequence of their own, taken from a group that
    keeps at least one (this microbatch first, then the latest earlier one; the shortest that
    fits in ``free`` ranks). Appends the new group to the last microbatch; False if none can move.
    """
    for groups in reversed(filled):
        movable = [(s.length, s.index, g, s) for g in groups if len(g[1]) > 1 for s in g[1]
                   if need[s.index] <= free]
        if movable:
            _, _, donor, seq = min(movable, key=lambda m: (m[0], m[1]))
            donor[1].remove(seq)
            donor[2] = sum(padded_length(x.length, donor[0]) for x in donor[1])
            size = need[seq.index]
            filled[-1].append([size, [seq], padded_length(seq.length, size)])
            return True
    return False


def _widen(groups: list[list], free: int, sizes: tuple[int, ...], msr: int) -> int:
    """Grow the smallest groups to larger allowed sizes until no rank is idle (or none can grow)."""
    while free:
        grown = False
        for g in sorted(groups, key=lambda g: (g[0], g[2])):
            bigger = [s for s in sizes if g[0] < s <= g[0] + free
                      and sum(padded_length(x.length, s) for x in g[1]) <= s * msr]
            if not bigger:
                continue
            new = min(bigger)
            free -= new - g[0]
            g[0] = new
            g[2] = sum(padded_length(s.length, new) for s in g[1])
            grown = True
            break
        if not grown:
            return free
    return 0
