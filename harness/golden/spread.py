"""How a metric varied over N repeats of the golden arm (:class:`Spread`, :func:`measure_spread`)
and the bound it gives (Megatron-LM's ``compute_golden_statistics.py``: the largest relative
deviation x 1.5, at least 0.1 %, for step time at least 5 %: :func:`rtol_floor`). Pure Python.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from .metrics import TIME_METRIC, window_median


# Megatron-LM's compute_golden_statistics.py: a tolerance is the largest relative deviation seen
# over N repeats x 1.5, at least 0.1 %; its MoE performance check refuses a baseline whose
# std/mean is above 2 %.
RTOL_FACTOR = 1.5
RTOL_FLOOR = 1e-3
MAX_CV = 0.02
# Step time's floor: Megatron's own iteration-time rtol, 5 %. Three repeats under-state the
# spread: on one H200 a fourth run of gpu1-qwen3-perf fell outside the 1.96 % that three repeats
# gave (bench/RESULTS-log.md, 2026-12-03), while a 10 % slowdown still clears 5 % plus that noise.
STEP_TIME_RTOL_FLOOR = 0.05


def rtol_floor(metric: str) -> float:
    """The least ``rtol`` repeats can give ``metric``: 5 % for step time, else 0.1 %."""
    return STEP_TIME_RTOL_FLOOR if metric == TIME_METRIC else RTOL_FLOOR


@dataclass(frozen=True)
class Spread:
    """How one metric varied over repeats of the arm: the largest relative deviation from the
    mean (``rel_dev``) and std/mean (``cv``), per step, or for step time of the per-run medians
    over the steady window; ``where`` says at which step (or window); ``rtol`` is the bound it
    gives (Megatron's rule: ``rel_dev`` x 1.5, at least :func:`rtol_floor`)."""

    metric: str
    repeats: int
    rel_dev: float
    cv: float
    where: str

    @property
    def rtol(self) -> float:
        return max(RTOL_FACTOR * self.rel_dev, rtol_floor(self.metric))


def _deviation(values: Sequence[float]) -> tuple[float, float]:
    """(largest |v - mean| / |mean|, std / |mean|) of repeated values (0, 0 for one value)."""
    if len(values) < 2:
        return 0.0, 0.0
    mean = statistics.fmean(values)
    if mean == 0:
        return (0.0, 0.0) if all(v == 0 for v in values) else (math.inf, math.inf)
    return (max(abs(v - mean) for v in values) / abs(mean),
            statistics.stdev(values) / abs(mean))


def measure_spread(metric: str, runs: Sequence[Mapping[int, float]],
                   window: Optional[tuple[int, int]] = None) -> Spread:
    """The spread of ``metric`` over the runs' series (each step -> value)."""
    if metric == TIME_METRIC and window is not None:
        medians = [window_median(r, window) for r in runs]
        kept = [m for m in medians if m is not None]
        rel, cv = _deviation(kept)
        return Spread(metric, len(runs), rel, cv,
                      f"median over steps {window[0]}..{window[1]}: "
                      + ", ".join(f"{m:.4g}" for m in kept))
    worst = (0.0, 0.0, "every step")
    for step in sorted(set().union(*runs)):
        rel, cv = _deviation([r[step] for r in runs if step in r])
        if (rel, cv) > worst[:2]:
            worst = (rel, cv, f"step {step}: " + ", ".join(f"{r[step]:.6g}" for r in runs if step in r))
    return Spread(metric, len(runs), worst[0], worst[1], worst[2])
