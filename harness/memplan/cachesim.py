"""PyTorch's CUDA caching allocator, replayed on a sequence of allocations and frees (pure).

A graph's private pool (``torch.cuda.MemPool``) reserves whatever segments the allocator maps
while the graphs are captured, and never gives them back while the pool lives: its size is the
segments, not the most bytes live at once. :class:`PoolSim` follows the rules of
``c10/cuda/CUDACachingAllocator.cpp`` (native backend, ``expandable_segments`` off,
``max_split_size`` unlimited, one stream) on the requests a capture makes:

* every request is rounded up to 512 bytes (``kMinBlockSize``, ``round_size``);
* requests of at most 1 MiB (``kSmallSize``) come from the small pool, larger ones from the large;
* a request takes the smallest free block of its pool that holds it (best fit; ties: the lowest
  address) and splits it when the rest is worth keeping (small pool: at least 512 bytes; large:
  more than 1 MiB);
* with no free block large enough, a new segment is mapped (``get_allocation_size``): 2 MiB for
  a small request (``kSmallBuffer``), 20 MiB for one under 10 MiB (``kLargeBuffer``,
  ``kMinLargeAlloc``), else the request rounded up to 2 MiB (``kRoundLarge``);
* a freed block merges with its free neighbours in its segment; a segment is never unmapped.

Checked against the pool segments measured on an H200 (bench/RESULTS-log.md, issue 42).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # kSmallSize
SMALL_BUFFER = 2 << 20  # kSmallBuffer
LARGE_BUFFER = 20 << 20  # kLargeBuffer
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge


def round_size(n: int) -> int:
    return MIN_BLOCK if n < MIN_BLOCK else (n + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


def segment_size(n: int) -> int:
    """The segment the allocator maps for a (rounded) request of ``n`` bytes it cannot place."""
    if n <= SMALL_SIZE:
        return SMALL_BUFFER
    if n < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (n + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


@dataclass
class _Block:
    addr: int
    size: int
    small: bool
    free: bool = True
    prev: "_Block | None" = field(default=None, repr=False)
    next: "_Block | None" = field(default=None, repr=False)


class PoolSim:
    """One private pool: :meth:`alloc` / :meth:`free` by the caller's key; :attr:`reserved` the
    bytes of its segments."""

    def __init__(self) -> None:
        self.reserved = 0
        self.segments: list[int] = []  # sizes, in the order mapped
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # (size, addr)
        self._by_addr: dict[int, _Block] = {}
        self._live: dict[object, _Block] = {}
        self._next_addr = 0

    def _insert(self, b: _Block) -> None:
        bisect.insort(self._free[b.small], (b.size, b.addr))

    def _remove(self, b: _Block) -> None:
        lst = self._free[b.small]
        del lst[bisect.bisect_left(lst, (b.size, b.addr))]

    def alloc(self, key: object, nbytes: int) -> None:
        """Request ``nbytes`` for ``key`` (a key still live is an error)."""
        if key in self._live:
            raise KeyError(f"{key!r} is allocated already")
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        lst = self._free[small]
        i = bisect.bisect_left(lst, (size, -1))
        if i < len(lst):
            _, addr = lst[i]
            b = self._by_addr[addr]
            self._remove(b)
        else:
            seg = segment_size(size)
            b = _Block(self._next_addr, seg, small)
            self._next_addr += seg + ROUND_LARGE  # segments are never adjacent
            self._by_addr[b.addr] = b
            self.reserved += seg
            self.segments.append(seg)
        rest = b.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_SIZE):
            r = _Block(b.addr + size, rest, small, True, b, b.next)
            if b.next is not None:
                b.next.prev = r
            b.next, b.size = r, size
            self._by_addr[r.addr] = r
            self._insert(r)
        b.free = False
        self._live[key] = b

    def free(self, key: object) -> None:
        b = self._live.pop(key)
        b.free = True
        for nb in (b.prev, b.next):
            if nb is not None and nb.free:
                self._remove(nb)
                lo, hi = (nb, b) if nb is b.prev else (b, nb)
                lo.size += hi.size
                lo.next = hi.next
                if hi.next is not None:
                    hi.next.prev = lo
                del self._by_addr[hi.addr]
                b = lo
        self._insert(b)

    @property
    def live_keys(self) -> int:
        return len(self._live)
