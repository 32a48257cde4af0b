"""Slot-planner speed: time ``plan_pipeline`` (and ``validate``) on a few pipeline shapes.

Run from the repository root: ``OMP_NUM_THREADS=1 .venv/bin/python bench/plan_speed.py [--repeat N]``.
Prints one row per shape: how many microbatch counts were planned, the CP variants, the physical
slots, the most saved arenas on any rank, the slot records over all ranks, and the best and median
wall time of planning all PP ranks and of validating the plan.

"every count" rows plan every microbatch count 1..N (``strict=False``: counts Megatron's
interleaved schedule rejects are planned too, the worst case for the planner); "schedulable" rows
plan only the counts the schedule allows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from harness.slotmem.plan import PipelinePlan, plan_pipeline  # noqa: E402
from harness.slotmem.schedule import allowed_microbatch_counts  # noqa: E402


@dataclass(frozen=True)
class Shape:
    name: str
    pp: int
    vpp: int
    group: Optional[int]
    max_microbatches: int
    cp_sizes: tuple[int, ...]
    layers_per_chunk: int
    every_count: bool  # plan 1..max (strict=False) instead of the schedulable counts only

    def counts(self) -> tuple[int, ...]:
        top = range(1, self.max_microbatches + 1)
        if self.every_count:
            return tuple(top)
        return allowed_microbatch_counts(self.pp, self.vpp, self.group or self.pp, top)

    def plan(self) -> PipelinePlan:
        return plan_pipeline(self.pp, self.vpp, self.counts(), self.cp_sizes,
                             self.layers_per_chunk, self.group, strict=not self.every_count)


SHAPES: tuple[Shape, ...] = (
    Shape("PP8xVPP4 every count", 8, 4, 8, 256, (1, 2, 4, 8), 2, True),
    Shape("PP8xVPP4 schedulable", 8, 4, 8, 256, (1, 2, 4, 8), 2, False),
    Shape("PP4xVPP4 every count", 4, 4, 4, 128, (1, 2), 2, True),
    Shape("PP2xVPP2 g3 schedulable", 2, 2, 3, 64, (1, 2), 4, False),
    Shape("PP4 no VPP every count", 4, 1, None, 256, (1, 2, 4), 8, True),
)


def _times(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def measure(shape: Shape, repeat: int) -> dict[str, object]:
    plan = shape.plan()
    plan_t = _times(shape.plan, repeat)
    validate_t = _times(plan.validate, max(1, repeat // 2))
    return {
        "shape": shape.name,
        "counts": len(shape.counts()),
        "cp": ",".join(map(str, plan.cp_sizes)),
        "slots": plan.physical_slots,
        "arenas": max(p.saved_colours for p in plan.ranks),
        "records": sum(len(p.records) for p in plan.ranks),
        "plan_best_ms": 1e3 * min(plan_t),
        "plan_median_ms": 1e3 * statistics.median(plan_t),
        "validate_ms": 1e3 * min(validate_t),
    }


def render(rows: Sequence[dict[str, object]]) -> str:
    header = ("shape", "counts", "cp", "slots", "arenas", "records",
              "plan best ms", "plan median ms", "validate ms")
    keys = ("shape", "counts", "cp", "slots", "arenas", "records",
            "plan_best_ms", "plan_median_ms", "validate_ms")
    cells = [[f"{r[k]:.1f}" if isinstance(r[k], float) else str(r[k]) for k in keys] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    line = lambda vals: "  ".join(v.ljust(w) if i == 0 else v.rjust(w)  # noqa: E731
                                  for i, (v, w) in enumerate(zip(vals, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, cells)])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per shape (default 5)")
    args = parser.parse_args(argv)
    print(render([measure(shape, max(1, args.repeat)) for shape in SHAPES]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
