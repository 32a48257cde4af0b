"""Golden values: one arm's per-step metrics, committed next to the case files, as Megatron-LM's
functional tests keep them.

A golden file is ``<golden dir>/<case id>/golden_values_<platform>.json`` (``compare.golden.dir``
relative to the case file's folder; platform ``cpu``, ``cuda`` or a declared GPU name such as
``h200``) holding Megatron's layout, one entry per metric::

    {"lm loss": {"start_step": 1, "end_step": 8, "step_interval": 1,
                 "values": {"1": 4.85, "2": 4.71, ...}},
     "aux loss": {...}, "grad norm": {...},
     "mem-allocated-bytes": {...}, "mem-max-allocated-bytes": {...}}   # memory: CUDA runs only

Values are stored unrounded (Megatron rounds to 5 decimals; a deterministic fp32 run repeats
bitwise, so rounding would only loosen the check). Memory is the largest figure over the arm's
ranks at each step. Pure Python: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional, Sequence, Union

from harness.results import PathLike, ResultsError, StepRecord, read_json, write_json_atomic

Record = Union[StepRecord, Mapping[str, Any]]
Steps = Mapping[int, Sequence[Record]]

# Megatron metric name -> step-record field.
LOSS_METRICS: Mapping[str, str] = MappingProxyType({
    "lm loss": "loss",
    "aux loss": "aux_loss",
    "grad norm": "grad_norm",
})
MEMORY_METRICS: Mapping[str, str] = MappingProxyType({
    "mem-allocated-bytes": "allocated_bytes",
    "mem-max-allocated-bytes": "max_allocated_bytes",
})


class GoldenError(ValueError):
    """A golden file is missing, unreadable, or does not cover the run (names the file)."""


@dataclass(frozen=True)
class Golden:
    """A golden file read back: metric -> step -> value."""

    path: Path
    metrics: Mapping[str, Mapping[int, float]]

    def series(self, metric: str) -> Mapping[int, float]:
        if metric not in self.metrics:
            raise GoldenError(f"{self.path}: no metric '{metric}' (has: "
                              f"{', '.join(sorted(self.metrics)) or 'none'}); re-record it with "
                              "`dcp-harness golden record`")
        return self.metrics[metric]


def golden_file(golden_dir: PathLike, case_id: str, platform: str) -> Path:
    return Path(golden_dir) / case_id / f"golden_values_{platform}.json"


def _get(rec: Record, key: str) -> Any:
    return getattr(rec, key, None) if isinstance(rec, StepRecord) else rec.get(key)


def platform_of(steps: Steps) -> str:
    """``cpu`` or ``cuda``, from the device the arm's records name (``cpu`` when none does)."""
    for rank in sorted(steps):
        for rec in steps[rank]:
            device = _get(rec, "device")
            if isinstance(device, str) and device:
                return device.split(":", 1)[0]
    return "cpu"


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _per_step(steps: Steps, key: str, combine: str) -> dict[int, float]:
    """Step -> ``key``: the lowest rank's value (``first``) or the largest over ranks (``max``)."""
    out: dict[int, float] = {}
    for rank in sorted(steps):
        for rec in steps[rank]:
            step, value = _get(rec, "step"), _number(_get(rec, key))
            if not isinstance(step, int) or value is None:
                continue
            if step not in out:
                out[step] = value
            elif combine == "max":
                out[step] = max(out[step], value)
    return dict(sorted(out.items()))


def loss_series(steps: Steps, metric: str) -> dict[int, float]:
    return _per_step(steps, LOSS_METRICS[metric], "first")


def memory_series(steps: Steps, metric: str) -> dict[int, float]:
    return _per_step(steps, MEMORY_METRICS[metric], "max")


def _entry(values: Mapping[int, float]) -> dict[str, Any]:
    steps = sorted(values)
    return {"start_step": steps[0], "end_step": steps[-1], "step_interval": 1,
            "values": {str(s): values[s] for s in steps}}


def golden_values(steps: Steps) -> dict[str, Any]:
    """The golden document of one arm's records (memory metrics only where they were recorded)."""
    doc: dict[str, Any] = {}
    for metric in LOSS_METRICS:
        values = loss_series(steps, metric)
        if values:
            doc[metric] = _entry(values)
    for metric in MEMORY_METRICS:
        values = memory_series(steps, metric)
        if values:
            doc[metric] = _entry(values)
    if "lm loss" not in doc:
        raise GoldenError("the arm recorded no loss: nothing to keep as golden values")
    return doc


def write_golden(path: PathLike, steps: Steps) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, golden_values(steps))
    return path


def _parse_entry(path: Path, metric: str, entry: Any) -> dict[int, float]:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("values"), Mapping):
        raise GoldenError(f"{path}: metric '{metric}' needs a 'values' mapping of step -> value")
    out: dict[int, float] = {}
    for key, value in entry["values"].items():
        try:
            step = int(key)
        except (TypeError, ValueError):
            raise GoldenError(f"{path}: metric '{metric}': step {key!r} is not an integer") from None
        number = _number(value)
        if number is None or not math.isfinite(number):
            raise GoldenError(f"{path}: metric '{metric}' step {step}: {value!r} is not a finite number")
        out[step] = number
    if not out:
        raise GoldenError(f"{path}: metric '{metric}' has no values")
    return dict(sorted(out.items()))


def read_golden(path: PathLike) -> Golden:
    """The golden file at ``path``; a GoldenError naming it when it is missing or malformed."""
    path = Path(path)
    if not path.is_file():
        raise GoldenError(f"no golden values at {path}; record them with `dcp-harness golden "
                          "record RESULTS_DIR` from a run you trust")
    try:
        doc = read_json(path)
    except (OSError, ResultsError) as exc:
        raise GoldenError(f"unreadable golden values: {exc}") from None
    if not isinstance(doc, Mapping):
        raise GoldenError(f"{path}: expected a JSON object of metric -> entry")
    return Golden(path, MappingProxyType({m: _parse_entry(path, m, e) for m, e in doc.items()}))
