"""One rank's share of a microbatch: CP sharding of packed sequences (load-balanced causal chunks).

With CP size ``c > 1`` each packed sequence is padded to a multiple of ``2c`` and cut into ``2c``
equal chunks; CP rank ``r`` holds chunks ``r`` and ``2c-1-r`` of every sequence of its group (so
causal work is balanced). Keys/values are all-gathered in CP-rank order, so the key layout is the
concatenation of every CP rank's local layout; the positions and sequence ids of all keys are known
without communication and give the exact attention mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.spec.layout import padded_length
from harness.workload.data import Table, sequence_tokens
from harness.workload.packing import GroupWork
from harness.workload.static import StaticLayout, static_layout


@dataclass(frozen=True)
class LocalBatch:
    inputs: torch.Tensor  # [T] int64 token ids (0 on padding)
    targets: torch.Tensor  # [T] int64 next-token ids (0 on padding)
    valid: torch.Tensor  # [T] bool, real tokens
    positions: torch.Tensor  # [T] int64, position within its sequence
    segments: torch.Tensor  # [T] int64, ordinal of its sequence in the group
    key_positions: torch.Tensor  # [T * cp] positions of the gathered keys
    key_segments: torch.Tensor  # [T * cp]
    cp_size: int
    unit_tokens: int  # real tokens of the whole CP group's share

    @property
    def real_tokens(self) -> int:
        return int(self.valid.sum())


def shard_layout(lengths: list[int], cp: int, cp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(segments, positions)`` of CP rank ``cp_rank``'s tokens for sequences of ``lengths``."""
    segs, poss = [], []
    for ordinal, n in enumerate(lengths):
        lp = padded_length(n, cp)
        if cp == 1:
            pos = torch.arange(lp)
        else:
            chunk = lp // (2 * cp)
            lo = cp_rank * chunk
            hi = (2 * cp - 1 - cp_rank) * chunk
            pos = torch.cat([torch.arange(lo, lo + chunk), torch.arange(hi, hi + chunk)])
        poss.append(pos)
        segs.append(torch.full_like(pos, ordinal))
    if not poss:
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty
    return torch.cat(segs), torch.cat(poss)


def local_batch(
    group: GroupWork, pool_rank: int, seed: int, step: int, vocab: int, table: Table
) -> LocalBatch:
    """The tokens, targets and layout of ``pool_rank`` in ``group`` for ``step``."""
    cp, r = group.size, pool_rank - group.start
    if not 0 <= r < cp:
        raise ValueError(f"pool rank {pool_rank} is not in the CP group at {group.start}..{group.start + cp - 1}")
    lengths = [s.length for s in group.sequences]
    segments, positions = shard_layout(lengths, cp, r)
    inputs = torch.zeros_like(positions)
    targets = torch.zeros_like(positions)
    offset = 0
    for s in group.sequences:
        n_local = padded_length(s.length, cp) // cp
        pos = positions[offset : offset + n_local]
        inp, tgt = sequence_tokens(seed, step, s.index, s.length, vocab, table)
        real = pos < s.length
        inputs[offset : offset + n_local][real] = inp[pos[real]]
        targets[offset : offset + n_local][real] = tgt[pos[real]]
        offset += n_local
    valid = positions < torch.tensor(lengths, dtype=torch.int64)[segments] if lengths else positions < 0
    key_segs, key_pos = [], []
    for q in range(cp):
        s_q, p_q = shard_layout(lengths, cp, q)
        key_segs.append(s_q)
        key_pos.append(p_q)
    return LocalBatch(
        inputs=inputs,
        targets=targets,
        valid=valid,
        positions=positions,
        segments=segments,
        key_positions=torch.cat(key_pos),
        key_segments=torch.cat(key_segs),
        cp_size=cp,
        unit_tokens=group.tokens,
    )


@dataclass(frozen=True)
class StaticBatch:
    """A rank's static-shape share of a microbatch: ``tokens`` rows laid out as ``layout`` says."""

    inputs: torch.Tensor  # [T] int64 (0 on padding)
    targets: torch.Tensor  # [T] int64
    layout: StaticLayout
    unit_tokens: int

    @property
    def valid(self) -> torch.Tensor:
        return self.layout.valid


def static_batch(group: GroupWork, pool_rank: int, seed: int, step: int, vocab: int,
                 table: Table, tokens: int, max_seqs: int) -> StaticBatch:
    """The tokens of ``pool_rank`` in ``group`` for ``step`` in a static buffer of ``tokens``
    rows (``harness.workload.static``)."""
    cp, r = group.size, pool_rank - group.start
    if not 0 <= r < cp:
        raise ValueError(f"pool rank {pool_rank} is not in the CP group at {group.start}..{group.start + cp - 1}")
    lengths = [s.length for s in group.sequences]
    layout = static_layout(lengths, cp, r, tokens, max_seqs)
    inputs = torch.zeros(tokens, dtype=torch.int64)
    targets = torch.zeros(tokens, dtype=torch.int64)
    for ordinal, s in enumerate(group.sequences):
        rows = (layout.segments == ordinal) & layout.valid
        inp, tgt = sequence_tokens(seed, step, s.index, s.length, vocab, table)
        pos = layout.positions[rows]
        inputs[rows] = inp[pos]
        targets[rows] = tgt[pos]
    return StaticBatch(inputs, targets, layout, group.tokens)
