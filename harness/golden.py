"""Golden values: one arm's per-step metrics, committed next to the case files, as Megatron-LM's
functional tests keep them.

A golden file is ``<golden dir>/<case id>/golden_values_<platform>.json`` (``compare.golden.dir``
relative to the case file's folder; platform ``cpu``, or the GPU the run used, from its CUDA device
name (``h200``, ``gb200``: :func:`platform_key`), or ``compare.golden.platform``) holding
Megatron's layout, one entry per metric::

    {"lm loss": {"start_step": 1, "end_step": 8, "step_interval": 1,
                 "values": {"1": 4.85, "2": 4.71, ...}},
     "aux loss": {...}, "grad norm": {...},
     "mem-allocated-bytes": {...}, "mem-max-allocated-bytes": {...}}   # memory: CUDA runs only

Values are stored unrounded (Megatron rounds to 5 decimals; a deterministic fp32 run repeats
bitwise, so rounding would only loosen the check). Memory is the largest figure over the arm's
ranks at each step. A sweep keeps a copy of every golden file of its cases as they were when it ran
(:func:`snapshot_golden`, :class:`GoldenCopy`), so judging reads no file outside the sweep. Pure
Python: no torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional, Sequence

from pydantic import BaseModel, ConfigDict

from harness.results import PathLike, ResultsError, StepRecord, field_of, read_json, write_json_atomic

Steps = Mapping[int, Sequence[StepRecord]]  # rank -> that rank's step records

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


_GOLDEN_NAME = re.compile(r"^golden_values_([a-z0-9][a-z0-9._-]*)\.json$")
# Words of a CUDA device name that say nothing about the chip ("NVIDIA GeForce RTX 4090").
_VENDOR_WORDS = ("nvidia", "geforce", "tesla", "quadro")


def platform_key(device_name: str) -> str:
    """The golden platform of a CUDA device name, as Megatron-LM keys its golden files by machine
    (``dgx_h100``, ``dgx_gb200``): ``NVIDIA H200`` -> ``h200``, ``NVIDIA GB200`` -> ``gb200``,
    ``NVIDIA H100 80GB HBM3`` -> ``h100``, ``NVIDIA A100-SXM4-80GB`` -> ``a100``, ``NVIDIA
    GeForce RTX 4090`` -> ``rtx4090``: the words up to and including the first one with a digit,
    vendor words dropped. bf16 and even fp32 numerics differ between GPU generations, so each has
    its own file."""
    words = [w for w in re.split(r"[^a-z0-9]+", device_name.lower()) if w]
    words = [w for w in words if w not in _VENDOR_WORDS]
    picked: list[str] = []
    for word in words:
        picked.append(word)
        if any(ch.isdigit() for ch in word):
            break
    key = "".join(picked) or "cuda"
    return key if key[0].isalnum() else "cuda"


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


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _per_step(steps: Steps, key: str, combine: str) -> dict[int, float]:
    """Step -> ``key``: the lowest rank's value (``first``) or the largest over ranks (``max``)."""
    out: dict[int, float] = {}
    for rank in sorted(steps):
        for rec in steps[rank]:
            step, value = rec.step, _number(field_of(rec, key))
            if value is None:
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


def golden_from_document(path: PathLike, doc: Any) -> Golden:
    """A golden document (a file's parsed JSON) read back; GoldenError naming ``path``."""
    path = Path(path)
    if not isinstance(doc, Mapping):
        raise GoldenError(f"{path}: expected a JSON object of metric -> entry")
    return Golden(path, MappingProxyType({m: _parse_entry(path, m, e) for m, e in doc.items()}))


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
    return golden_from_document(path, doc)


class GoldenCopy(BaseModel):
    """One golden file as a sweep found it when it ran: where it was, its content hash and its
    parsed document (or why it could not be parsed). Kept in the sweep's plan, so a gate run from
    another directory or machine judges by the same values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    sha256: str
    document: Optional[dict[str, Any]] = None
    error: Optional[str] = None

    def golden(self) -> Golden:
        """The values (GoldenError for a file that was unreadable when the sweep copied it)."""
        if self.document is None:
            raise GoldenError(f"unreadable golden values: {self.path}: {self.error}")
        return golden_from_document(self.path, self.document)


def snapshot_golden(golden_dir: PathLike, case_id: str) -> dict[str, GoldenCopy]:
    """Platform -> a copy of ``<golden_dir>/<case_id>/golden_values_<platform>.json``, for every
    platform that has a file there ({} when none does)."""
    folder = Path(golden_dir) / case_id
    out: dict[str, GoldenCopy] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.iterdir()):
        match = _GOLDEN_NAME.match(path.name)
        if match is None or not path.is_file():
            continue
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            out[match.group(1)] = GoldenCopy(path=str(path), sha256=digest, error=str(exc))
            continue
        if isinstance(doc, dict):
            out[match.group(1)] = GoldenCopy(path=str(path), sha256=digest, document=doc)
        else:
            out[match.group(1)] = GoldenCopy(path=str(path), sha256=digest,
                                             error="expected a JSON object of metric -> entry")
    return out
