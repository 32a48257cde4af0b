"""Static-shape microbatches: each rank's tokens in a fixed buffer, sequence metadata in fixed-size
tensors (what a CUDA graph can replay; every arm of a graph case uses it).

A rank's microbatch is ``T`` tokens (``Case.layout.tokens_per_rank``: ``max_seqlen_per_rank`` with
dynamic CP, ``seq_length / cp`` with fixed CP; Megatron's pad-packed-seq alignment ``max``). With CP size
``c`` every packed sequence is padded to a multiple of ``2c`` and cut into ``2c`` equal chunks; CP
rank ``r`` holds chunks ``r`` ("A") and ``2c-1-r`` ("B") of each sequence of its group, so causal
work is balanced. The local buffer is laid out ``[A chunks of every sequence, padding | B chunks,
padding]`` (two halves of ``T/2`` rows; with ``c == 1`` one run ``[sequences, padding]``), so the
rank's attention is two flash-varlen calls whose queries are contiguous halves:

* call A: the A chunk of sequence ``i`` (positions ``[r*ch, (r+1)*ch)``) attends the keys of its
  positions ``[0, (r+1)*ch)``; call B: the B chunk attends ``[0, (2c-r)*ch)``; causality is
  bottom-right aligned inside each (query, key-prefix) segment;
* the keys of a call are the all-gathered K/V rows (CP-rank order, ``c*T`` rows) picked by a
  fixed-size index buffer (``c*T`` entries, unused ones 0 and beyond the last offset);
* each call's ``cu_seqlens`` are ``max_seqs + 2`` int32 offsets (sequences, one padding segment
  whose queries attend only padding keys, unused entries repeating the last offset).

Padding is masked out of the loss (``valid``) and the router's statistics, and never attended by
real tokens. Everything here is a pure function of the group's sequences (host tensors); the
training loop copies them into device buffers before each microbatch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.spec.layout import padded_length


@dataclass(frozen=True)
class VarlenCall:
    """One varlen attention call over a contiguous run of the local queries."""

    q_start: int  # first local query row
    q_len: int  # query rows (static: T/2, or T for CP 1)
    cu_q: torch.Tensor  # [max_seqs + 2] int32
    cu_k: torch.Tensor  # [max_seqs + 2] int32
    k_index: torch.Tensor | None  # [c*T] int64 rows of the gathered keys (None: the local keys)


@dataclass(frozen=True)
class StaticLayout:
    """One rank's static-shape share of one microbatch (host tensors)."""

    tokens: int  # T
    cp_size: int
    positions: torch.Tensor  # [T] int64 (0 on padding)
    segments: torch.Tensor  # [T] int64 sequence ordinal (-1 on padding)
    valid: torch.Tensor  # [T] bool
    calls: tuple[VarlenCall, ...]  # (A,) for CP 1, (A, B) otherwise
    real_tokens: int

    def metadata(self) -> tuple[torch.Tensor, ...]:
        """The attention metadata tensors in the fixed order the layers take them:
        ``positions, k_index_a, cu_q_a, cu_k_a, k_index_b, cu_q_b, cu_k_b`` (CP 1 has no call B:
        its B tensors are one-element placeholders, so every CP variant takes the same count)."""
        a = self.calls[0]
        b = self.calls[1] if len(self.calls) > 1 else None
        dummy_i = torch.zeros(1, dtype=torch.int64)
        dummy_c = torch.zeros(1, dtype=torch.int32)
        return (
            self.positions,
            a.k_index if a.k_index is not None else dummy_i,
            a.cu_q,
            a.cu_k,
            b.k_index if b is not None and b.k_index is not None else dummy_i,
            b.cu_q if b is not None else dummy_c,
            b.cu_k if b is not None else dummy_c,
        )


class StaticLayoutError(ValueError):
    """A microbatch does not fit the static buffers (a packer or case bound was violated)."""


def _cu(lengths: list[int], cap: int) -> torch.Tensor:
    if len(lengths) > cap + 1:
        raise StaticLayoutError(f"{len(lengths) - 1} sequences but the metadata buffers hold {cap}")
    offs = [0]
    for n in lengths:
        offs.append(offs[-1] + n)
    offs += [offs[-1]] * (cap + 2 - len(offs))
    return torch.tensor(offs, dtype=torch.int32)


def static_layout(lengths: list[int], cp: int, cp_rank: int, tokens: int, max_seqs: int) -> StaticLayout:
    """The layout of CP rank ``cp_rank`` of a group of size ``cp`` holding sequences of
    ``lengths`` (real tokens, in group order), in a buffer of ``tokens`` rows."""
    if not 0 <= cp_rank < cp:
        raise StaticLayoutError(f"CP rank {cp_rank} is not in a group of {cp}")
    if len(lengths) > max_seqs:
        raise StaticLayoutError(
            f"{len(lengths)} sequences in one CP group but train.max_seqs_per_microbatch is "
            f"{max_seqs}")
    if cp > 1 and tokens % 2:
        raise StaticLayoutError(f"the per-rank buffer ({tokens} tokens) must be even")
    padded = [padded_length(n, cp) for n in lengths]
    local = sum(padded) // cp
    if local > tokens:
        raise StaticLayoutError(
            f"CP rank {cp_rank} of a CP{cp} group holds {local} tokens (sequences {lengths}, "
            f"padded to multiples of {2 * cp if cp > 1 else 1}) but the static buffer has {tokens}")
    t = tokens
    positions = torch.zeros(t, dtype=torch.int64)
    segments = torch.full((t,), -1, dtype=torch.int64)
    if cp == 1:
        off = 0
        for i, n in enumerate(lengths):
            positions[off:off + n] = torch.arange(n)
            segments[off:off + n] = i
            off += n
        valid = segments >= 0
        cu = _cu(list(lengths) + [t - off], max_seqs)
        call = VarlenCall(0, t, cu, cu.clone(), None)
        return StaticLayout(t, cp, positions, segments, valid, (call,), sum(lengths))
    half = t // 2
    chunks = [p // (2 * cp) for p in padded]
    starts = [sum(chunks[:i]) for i in range(len(chunks))]  # offset of sequence i in each half
    used = sum(chunks)
    pad = half - used
    for i, ch in enumerate(chunks):
        for h, j in ((0, cp_rank), (1, 2 * cp - 1 - cp_rank)):
            rows = slice(h * half + starts[i], h * half + starts[i] + ch)
            positions[rows] = torch.arange(j * ch, (j + 1) * ch)
            segments[rows] = i
    valid = (segments >= 0) & (positions < torch.tensor(lengths + [0], dtype=torch.int64)[segments])

    def key_row(i: int, p: int) -> int:
        ch = chunks[i]
        j = p // ch
        owner, h = (j, 0) if j < cp else (2 * cp - 1 - j, 1)
        return owner * t + h * half + starts[i] + p % ch

    calls = []
    for h, j in ((0, cp_rank), (1, 2 * cp - 1 - cp_rank)):
        k_rows: list[int] = []
        k_lens, q_lens = [], []
        for i, ch in enumerate(chunks):
            klen = (j + 1) * ch
            k_rows.extend(key_row(i, p) for p in range(klen))
            k_lens.append(klen)
            q_lens.append(ch)
        # the padding segment: this rank's padding rows of this half attend only themselves
        k_rows.extend(cp_rank * t + h * half + used + q for q in range(pad))
        k_lens.append(pad)
        q_lens.append(pad)
        cap = cp * t
        if len(k_rows) > cap:  # cannot happen for layouts that fit (sum of prefixes <= c*T)
            raise StaticLayoutError(f"call {'AB'[h]} needs {len(k_rows)} keys, more than {cap}")
        index = torch.zeros(cap, dtype=torch.int64)
        index[: len(k_rows)] = torch.tensor(k_rows, dtype=torch.int64)
        calls.append(VarlenCall(h * half, half, _cu(q_lens, max_seqs), _cu(k_lens, max_seqs), index))
    return StaticLayout(t, cp, positions, segments, valid, tuple(calls), sum(lengths))
