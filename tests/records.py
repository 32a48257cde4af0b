"""Typed step records for tests, each built in one call: what a rank writes (``StepRecord`` and
what it nests), never a plain mapping. Fields left out keep ``StepRecord``'s defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from harness.results import GraphStats, MemoryProbe, StepRecord, StepWriter

GIB = 1024 ** 3

Steps = dict[int, list[StepRecord]]  # rank -> records


def record(step: int, loss: Optional[float] = 2.0, **fields: Any) -> StepRecord:
    """One rank's record of ``step``: ``loss``, grad norm 1.0, then ``fields``."""
    return StepRecord(**{"step": step, "loss": loss, "grad_norm": 1.0, **fields})


def probe(used: float, *, total: float = 100 * GIB, allocated: Optional[float] = None,
          active: Optional[float] = None, reserved: float = 0) -> MemoryProbe:
    """A memory probe of ``used`` device bytes (allocated and active default to ``used``)."""
    return MemoryProbe(device_used_bytes=int(used), device_total_bytes=int(total),
                       allocated_bytes=int(used if allocated is None else allocated),
                       active_bytes=int(used if active is None else active),
                       reserved_bytes=int(reserved))


def graph_stats(pool: float, largest: float, pools: int, **fields: Any) -> GraphStats:
    """Capture statistics of ``pools`` graph pools of ``pool`` bytes together, the largest
    ``largest``; the other figures small and fixed unless given."""
    given: dict[str, Any] = {
        "summary": "2 dynamic-CP variants over 4 slot-aliased physical pool slots", "variants": 2,
        "physical_slots": 4, "graphs": 8, "pool_reserved_bytes": int(pool),
        "pool_allocated_bytes": 0, "arena_bytes": 0, "largest_pool_bytes": int(largest),
        "pools": pools, "capture_s": 0.1, "warmup_s": 0.1, "capture_peak_bytes": 0,
        "warmup_peak_bytes": 0}
    return GraphStats(**{**given, **fields})


def changed(steps: Mapping[int, Iterable[StepRecord]], at: Mapping[int, Mapping[str, Any]]) -> Steps:
    """``steps`` with the fields ``at[step]`` changed on every rank's record of that step."""
    return {rank: [dataclasses.replace(r, **at.get(r.step, {})) for r in recs]
            for rank, recs in steps.items()}


def write_steps(arm_dir: Path, steps: Mapping[int, Iterable[StepRecord]]) -> None:
    """Append every rank's records to ``arm_dir`` through the results store."""
    for rank, recs in steps.items():
        writer = StepWriter(arm_dir, rank)
        for rec in recs:
            writer.append(rec)
