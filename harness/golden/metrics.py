"""What a golden file measures: Megatron's metrics (name, kind, how a step record gives it, how
the ranks' values of a step combine), an arm's series of one (:func:`metric_series`), step
time's steady window, and what the arm's records say of where they ran (platform, environment,
devices). Pure Python: no torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional, Sequence

from harness.results import RunEnvironment, StepRecord, field_of


Steps = Mapping[int, Sequence[StepRecord]]  # rank -> that rank's step records

LOSS, TIME, MEMORY = "loss", "time", "memory"  # metric kinds


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _field(key: str) -> Callable[[StepRecord], Optional[float]]:
    return lambda rec: _number(field_of(rec, key))


def _nested(outer: str, key: str) -> Callable[[StepRecord], Optional[float]]:
    def read(rec: StepRecord) -> Optional[float]:
        inner = field_of(rec, outer)
        return None if inner is None else _number(getattr(inner, key))
    return read


@dataclass(frozen=True)
class Metric:
    """One golden metric: Megatron's name, its kind, how a record gives it, and how the ranks'
    values of a step combine (``first``: the lowest rank's, for figures every rank shares;
    ``max``: the largest, for time and memory)."""

    name: str
    kind: str
    read: Callable[[StepRecord], Optional[float]]
    combine: str
    what: str


METRICS: tuple[Metric, ...] = (
    Metric("lm loss", LOSS, _field("loss"), "first", "LM loss"),
    Metric("aux loss", LOSS, _field("aux_loss"), "first", "aux loss"),
    Metric("grad norm", LOSS, _field("grad_norm"), "first", "grad norm"),
    Metric("iteration-time", TIME, _field("step_time_s"), "max", "step time (s, slowest rank)"),
    Metric("mem-allocated-bytes", MEMORY, _field("allocated_bytes"), "max", "allocated bytes"),
    Metric("mem-max-allocated-bytes", MEMORY, _field("max_allocated_bytes"), "max",
           "max allocated bytes"),
    Metric("mem-reserved-bytes", MEMORY, _field("reserved_bytes"), "max", "reserved bytes"),
    Metric("mem-graph-pool-bytes", MEMORY, _nested("graph_stats", "pool_reserved_bytes"), "max",
           "graph pool reserved bytes (capture step)"),
    Metric("mem-device-used-bytes", MEMORY, _nested("memory_probe", "device_used_bytes"), "max",
           "device used after empty_cache (memory probe)"),
)
METRIC: Mapping[str, Metric] = MappingProxyType({m.name: m for m in METRICS})
TIME_METRIC = "iteration-time"


def platform_of(steps: Steps) -> str:
    """The platform the arm's records were made on: their ``platform`` (``cpu``, ``h200`` ...,
    written by the rank from its device), else the type of their ``device`` (``cpu``/``cuda``,
    records of older runs); ``cpu`` when no record names either."""
    for rank in sorted(steps):
        for rec in steps[rank]:
            if rec.platform:
                return rec.platform
            if rec.device:
                return rec.device.split(":", 1)[0]
    return "cpu"


def environment_of(steps: Steps) -> Optional[RunEnvironment]:
    """The environment the arm's lowest rank recorded first (None: records of older runs)."""
    for rank in sorted(steps):
        for rec in steps[rank]:
            if rec.environment is not None:
                return rec.environment
    return None


def run_devices(steps: Steps) -> tuple[str, ...]:
    """The devices (``RunEnvironment.device_id``) the arm's ranks recorded, sorted, each once;
    empty for records that name none (older runs)."""
    found = set()
    for rank in steps:
        env = next((rec.environment for rec in steps[rank] if rec.environment is not None), None)
        if env is not None and env.device_id:
            found.add(env.device_id)
    return tuple(sorted(found))


def metric_series(steps: Steps, metric: str) -> dict[int, float]:
    """Step -> ``metric`` of one arm: the lowest rank's value, or the largest over ranks (time,
    memory); steps without a value left out."""
    m = METRIC[metric]
    out: dict[int, float] = {}
    for rank in sorted(steps):
        for rec in steps[rank]:
            step, value = rec.step, m.read(rec)
            if value is None:
                continue
            if step not in out:
                out[step] = value
            elif m.combine == "max":
                out[step] = max(out[step], value)
    return dict(sorted(out.items()))


def steady_window(last_step: int, window: Optional[Sequence[int]] = None) -> tuple[int, int]:
    """The steps the step time's median is taken over: ``window`` (first, last), else Megatron's
    steady window (steps 5..20, or 30..45 for a run past step 25), cut to ``1..last_step``; when
    that leaves fewer than two steps, every step after the first (warm-up) does."""
    first, last = window if window is not None else ((5, 20) if last_step <= 25 else (30, 45))
    first, last = max(1, first), min(last, last_step)
    if window is None and last - first < 1:
        first, last = min(2, last_step), last_step
    return first, last


def window_median(series: Mapping[int, float], window: tuple[int, int]) -> Optional[float]:
    """The median of ``series`` over the steps of ``window`` (None: no step there)."""
    values = [v for s, v in series.items() if window[0] <= s <= window[1]]
    return statistics.median(values) if values else None
