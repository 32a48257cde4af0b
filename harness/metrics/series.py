"""What a reader gives: the values of each step, global (every rank's) and per rank, and how they
become the harness's typed step records (``harness.results.StepRecord``).

A metric's name is the step-record field it fills (``loss``, ``grad_norm``, ``lr``,
``step_time_s``, ``allocated_bytes``, ``max_allocated_bytes``, ``reserved_bytes``,
``active_bytes``, ``aux_loss``, ``tokens``, ``skipped``, ``nan``): the one list is
``harness.spec.schema.METRIC_FIELDS``. Megatron logs the loss once for the whole run (the last
rank prints and writes TensorBoard), so those values are every rank's; its memory report is per
rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from harness.results import StepRecord

# Fields holding whole numbers (bytes, counts); the rest are floats, but skipped / nan flags.
_INT_FIELDS = frozenset({"allocated_bytes", "max_allocated_bytes", "reserved_bytes",
                         "active_bytes", "tokens"})
_FLAG_FIELDS = frozenset({"skipped", "nan"})
# Fields that are one rank's own (its memory), not the run's: a source written by one rank (Megatron's
# TensorBoard, on the last rank) gives them to that rank alone.
RANK_OWN_FIELDS = frozenset({"allocated_bytes", "max_allocated_bytes", "reserved_bytes",
                             "active_bytes"})


@dataclass
class StepMetrics:
    """Step -> field -> value: ``shared`` holds the values of the whole run (every rank's),
    ``per_rank`` rank -> step -> field -> value (a rank's own memory)."""

    shared: dict[int, dict[str, float]] = field(default_factory=dict)
    per_rank: dict[int, dict[int, dict[str, float]]] = field(default_factory=dict)

    @property
    def steps(self) -> list[int]:
        """The steps with a value, ascending."""
        return sorted(set(self.shared).union(*(set(s) for s in self.per_rank.values())))


def _typed(name: str, value: float) -> object:
    if name in _FLAG_FIELDS:
        return bool(value) if math.isfinite(value) else True
    if name in _INT_FIELDS:
        return int(round(value)) if math.isfinite(value) else None
    return float(value)


def step_record(step: int, values: Mapping[str, float], platform: Optional[str]) -> StepRecord:
    """One step record from a step's values (``nan`` set when the loss or grad norm is not
    finite, as the built-in workload records it)."""
    data: dict[str, object] = {k: _typed(k, v) for k, v in values.items()}
    bad = any(isinstance(data.get(k), float) and not math.isfinite(data[k])  # type: ignore[arg-type]
              for k in ("loss", "grad_norm"))
    data["nan"] = bool(data.get("nan", False)) or bad
    return StepRecord.from_dict({"step": step, "platform": platform, **data})


def rank_records(metrics: StepMetrics, ranks: Sequence[int],
                 platform: Optional[str]) -> dict[int, list[StepRecord]]:
    """Rank -> its step records, ascending: each step's shared values and the rank's own."""
    out: dict[int, list[StepRecord]] = {}
    for rank in ranks:
        own = metrics.per_rank.get(rank, {})
        steps = sorted(set(metrics.shared) | set(own))
        out[rank] = [step_record(s, {**metrics.shared.get(s, {}), **own.get(s, {})}, platform)
                     for s in steps]
    return out
