"""Plain reference computations the slotmem tests check the planner and the warmup against.

Each is the obvious, slow way to get a figure the package computes another way (or relies on):
kept here, beside the tests, since the package itself never needs them."""

from __future__ import annotations

from typing import Sequence

from harness.slotmem.warmup import WarmupStep


def max_outstanding(order: Sequence[int], chunks: int) -> tuple[int, ...]:
    """Per chunk, the most forwards whose backward has not run yet, at any point of the order."""
    live = [0] * chunks
    peak = [0] * chunks
    for entry in order:
        c = abs(entry) - 1
        if entry > 0:
            live[c] += 1
            peak[c] = max(peak[c], live[c])
        else:
            live[c] -= 1
    return tuple(peak)


def is_proper(adjacency: Sequence[int], colours: Sequence[int]) -> bool:
    """True when no edge of ``adjacency`` (one bit mask of neighbours per vertex) joins two
    vertices of the same colour."""
    for v, mask in enumerate(adjacency):
        m = mask
        while m:
            low = m & -m
            if colours[low.bit_length() - 1] == colours[v]:
                return False
            m ^= low
    return True


def held_frames(steps: Sequence[WarmupStep]) -> tuple[int, ...]:
    """Frames held after each warmup step (a forward adds one, its backward releases it)."""
    held: set[tuple[int, ...]] = set()
    out: list[int] = []
    for s in steps:
        key = (s.iteration, *s.frame)
        if s.forward:
            held.add(key)
        else:
            held.discard(key)
        out.append(len(held))
    return tuple(out)
