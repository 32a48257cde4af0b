"""DSATUR greedy graph colouring on bitmask adjacency lists (deterministic)."""

from __future__ import annotations

import heapq
from typing import Sequence


def dsatur(adjacency: Sequence[int]) -> tuple[int, ...]:
    """Colour vertices ``0..n-1`` so that no edge joins two vertices of one colour.

    ``adjacency[v]`` is the bitmask of ``v``'s neighbours; it must be symmetric and have no self
    loops. The next vertex is the uncoloured one with the most distinct neighbour colours
    (saturation), ties broken by degree, then by the lower index; it takes the smallest colour
    none of its neighbours has. Colours are ``0..k-1``.
    """
    n = len(adjacency)
    for v, mask in enumerate(adjacency):
        if mask >> v & 1:
            raise ValueError(f"vertex {v} is its own neighbour")
        if mask >> n:
            raise ValueError(f"vertex {v} has a neighbour outside 0..{n - 1}")
    colour = [-1] * n
    seen = [0] * n  # bitmask of colours among each vertex's coloured neighbours
    degree = [mask.bit_count() for mask in adjacency]
    heap = [(0, -degree[v], v) for v in range(n)]
    heapq.heapify(heap)
    uncoloured = (1 << n) - 1
    while heap:
        neg_sat, _, v = heapq.heappop(heap)
        if colour[v] >= 0 or -neg_sat != seen[v].bit_count():
            continue  # stale heap entry
        used = seen[v]
        c = (~used & (used + 1)).bit_length() - 1  # lowest colour not used by a neighbour
        colour[v] = c
        uncoloured &= ~(1 << v)
        bit = 1 << c
        m = adjacency[v] & uncoloured
        while m:
            low = m & -m
            u = low.bit_length() - 1
            m ^= low
            if not seen[u] & bit:
                seen[u] |= bit
                heapq.heappush(heap, (-seen[u].bit_count(), -degree[u], u))
    return tuple(colour)
