"""Small text helpers shared by reports and the CLI (a leaf: no torch, nothing else of harness)."""

from __future__ import annotations

from typing import Sequence


def collapse_runs(values: Sequence[int], *, dash: str = "-", sep: str = ", ") -> str:
    """Consecutive integers as ranges: ``[1, 2, 3, 7]`` -> ``'1-3, 7'`` (``dash``/``sep`` set the
    range and item separators). ``values`` must be sorted and non-empty."""
    out: list[str] = []
    start = prev = values[0]
    for v in list(values[1:]) + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}{dash}{prev}")
        if v is not None:
            start = prev = v
    return sep.join(out)
