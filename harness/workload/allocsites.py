"""Where a rank's GPU memory is, by pool and allocation site, and how two arms differ (pure).

Input: the caching allocator's segments (``slotmem.allocator.allocator_segments``, recorded with
``record_allocation_sites(True)`` so every live block carries the Python stack that allocated it).
Each block falls in one bucket ``(pool, state, site)``:

* ``pool``: ``graph pool`` (a private MemPool: the CUDA-graph pool) or ``default``;
* ``state``: ``active`` (a live tensor, also one awaiting its free on another stream) or ``free``
  (cached but unused: reserved bytes beside live blocks of the same segment, which
  ``empty_cache()`` cannot return);
* ``site``: the innermost frame in this project (``harness/...py:LINE function``) of the block's
  stack; a free block takes the site of the largest live block of its segment (``free beside
  SITE``), since the allocator keeps no stack for cached space.

:func:`harness.sites.diff_sites` lines two arms' buckets up (candidate minus reference), largest
change first: the explanation of a reserved-bytes delta (TE #3353 left it "for follow-up
profiling"); the records and their file (``<arm>/sites.rank<r>.json``) are in ``harness.sites``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

# The records and their diff are the results' (a leaf the reports read): re-exported here.
from harness.sites import SiteBytes, SiteDelta, diff_sites, pool_totals

__all__ = ["SiteBytes", "SiteDelta", "diff_sites", "frame_site", "pool_totals",
           "summarize_segments"]

DEFAULT_POOL = "default"
GRAPH_POOL = "graph pool"
ACTIVE = "active"
FREE = "free"
NO_FRAME = "<no Python frame recorded>"
_PROJECT = "harness/"


def frame_site(frames: Sequence[Mapping[str, Any]]) -> str:
    """The innermost project frame of a stack (innermost first), as ``harness/x.py:LINE name``;
    else the innermost frame outside torch; else :data:`NO_FRAME`."""
    outside = None
    for f in frames:
        name = str(f.get("filename", ""))
        at = name.rfind("/" + _PROJECT)
        if at >= 0 or name.startswith(_PROJECT):
            rel = name[at + 1:] if at >= 0 else name
            return f"{rel}:{f.get('line', '?')} {f.get('name', '?')}"
        if outside is None and "/torch/" not in name and name and not name.startswith("<"):
            outside = f"{name}:{f.get('line', '?')} {f.get('name', '?')}"
    return outside or NO_FRAME


def _pool(segment: Mapping[str, Any]) -> str:
    pid = tuple(segment.get("segment_pool_id", (0, 0)) or (0, 0))
    return DEFAULT_POOL if pid == (0, 0) else GRAPH_POOL


def summarize_segments(segments: Iterable[Mapping[str, Any]]) -> tuple[SiteBytes, ...]:
    """The (pool, state, site) buckets of one allocator snapshot, largest first."""
    acc: dict[tuple[str, str, str], list[int]] = {}

    def add(key: tuple[str, str, str], size: int) -> None:
        slot = acc.setdefault(key, [0, 0])
        slot[0] += size
        slot[1] += 1

    for seg in segments:
        pool = _pool(seg)
        blocks = list(seg.get("blocks", ()))
        live = [b for b in blocks if str(b.get("state", "")).startswith("active")]
        owner = (max(live, key=lambda b: int(b.get("size", 0))) if live else None)
        owner_site = frame_site(owner.get("frames", ())) if owner is not None else NO_FRAME
        for b in blocks:
            size = int(b.get("size", 0))
            if str(b.get("state", "")).startswith("active"):
                add((pool, ACTIVE, frame_site(b.get("frames", ()))), size)
            else:
                add((pool, FREE, f"free beside {owner_site}"), size)
    out = [SiteBytes(p, s, site, n, k) for (p, s, site), (n, k) in acc.items()]
    return tuple(sorted(out, key=lambda x: (-x.bytes, x.pool, x.state, x.site)))
