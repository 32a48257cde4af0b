"""Golden values: one arm's per-step metrics, committed next to the case files, as Megatron-LM's
functional tests keep them.

A golden file is ``<golden dir>/<case id>/golden_values_<key>.json`` (``compare.golden.dir``
relative to the case file's folder). The key is the platform (``cpu``, or the GPU the run used,
from its CUDA device name: ``h200``, ``gb200``: :func:`platform_key`; or
``compare.golden.platform``), or ``<environment>_<platform>`` when ``compare.golden.environment``
is set (Megatron's ``golden_values_{environment}_{platform}.json``; :func:`golden_key`,
:func:`environment_key`). The file holds Megatron's layout, one entry per metric::

    {"lm loss": {"start_step": 1, "end_step": 8, "step_interval": 1,
                 "values": {"1": 4.85, "2": 4.71, ...}},
     "aux loss": {...}, "grad norm": {...}, "iteration-time": {...},
     "mem-allocated-bytes": {...}, "mem-max-allocated-bytes": {...},   # memory: CUDA runs only
     "mem-reserved-bytes": {...}, "mem-graph-pool-bytes": {...}, "mem-device-used-bytes": {...}}

Values are stored unrounded (Megatron rounds to 5 decimals; a deterministic fp32 run repeats
bitwise, so rounding would only loosen the check). Step time is the slowest rank's, memory the
largest figure over the arm's ranks at each step (the graph pool on the capture step, the device
used after ``empty_cache`` on the memory-probe step). Each entry may carry more than Megatron's
four keys (Megatron's reader ignores them): ``environment`` (what the run ran with:
``harness.results.RunEnvironment``), ``arm`` (the arm the values came from: a check of another
arm is an error, ``harness.compare.contracts.golden``), ``inherited_env`` (a command arm's
inherited environment, ``harness.results.inherited_env``: ``gate`` notes a sweep whose arm
inherited another), and, recorded from N repeats (``dcp-harness golden record
--repeats N``), ``repeats``, the per-step ``min`` and ``max`` over the repeats (``values`` is the
per-step median), ``cv`` (std/mean) and, for step time and memory, ``rtol``: the bound the
verdict uses, Megatron's rule (the largest relative deviation from the mean over the repeats x
1.5, at least 0.1 %, for step time at least Megatron's 5 %: :func:`rtol_floor`); step time's
entry also names the ``devices`` the repeats ran on (their ``RunEnvironment.device_id``): its
``rtol`` measured those devices' noise, and holds there only. A sweep keeps a copy of every golden
file of its cases as they were when it ran (:func:`snapshot_golden`, :class:`GoldenCopy`), so
judging reads no file outside the sweep.
Pure Python: no torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Callable, Container, Iterable, Mapping, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field

from harness import kernels as kern
from harness.results import (
    PathLike,
    ResultsError,
    RunEnvironment,
    StepRecord,
    field_of,
    read_json,
    read_typed,
    record_json,
    write_json_atomic,
)
from harness.spec.schema import LossBound, Tolerance
from harness.textfmt import collapse_runs

Steps = Mapping[int, Sequence[StepRecord]]  # rank -> that rank's step records

LOSS, TIME, MEMORY = "loss", "time", "memory"  # metric kinds

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


class GoldenError(ValueError):
    """A golden file is missing, unreadable, or does not cover the run (names the file)."""


@dataclass(frozen=True)
class Golden:
    """A golden file read back: metric -> step -> value, and what its entries say beyond the
    values (``rtol``, ``repeats`` per metric; the recorded environment)."""

    path: Path
    metrics: Mapping[str, Mapping[int, float]]
    rtols: Mapping[str, float] = field(default_factory=dict)
    repeats: Mapping[str, int] = field(default_factory=dict)
    environment: Optional[RunEnvironment] = None
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # metric -> the largest relative deviation of a repeat from the recorded value (``min`` /
    # ``max`` against ``values``, over the steps): files recorded from repeats only
    spreads: Mapping[str, float] = field(default_factory=dict)
    # The arm whose runs the values came from (None: a file recorded before dcp-harness kept it)
    arm: Optional[str] = None
    # What that arm's command inherited from the shell that ran it (``inherited_env.json``,
    # secrets redacted; None: not a command arm, or a file recorded before dcp-harness kept it)
    inherited_env: Optional[Mapping[str, str]] = None

    def series(self, metric: str) -> Mapping[int, float]:
        if metric not in self.metrics:
            raise GoldenError(f"{self.path}: no metric '{metric}' (has: "
                              f"{', '.join(sorted(self.metrics)) or 'none'}); re-record it with "
                              "`dcp-harness golden record`")
        return self.metrics[metric]

    def rtol(self, metric: str) -> Optional[float]:
        """The bound ``golden record --repeats`` derived for ``metric`` (None: recorded once)."""
        return self.rtols.get(metric)

    def devices_of(self, metric: str) -> tuple[str, ...]:
        """The devices (``device_id``) the repeats behind ``metric``'s ``rtol`` ran on (every
        rank's, of every repeat); empty when the file does not say (recorded before dcp-harness
        kept them)."""
        return self.devices.get(metric, ())


def golden_key(platform: str, environment: Optional[str] = None) -> str:
    """The key of a golden file: the platform, or ``<environment>_<platform>`` (Megatron's
    ``{environment}_{platform}``)."""
    return f"{environment}_{platform}" if environment else platform


def golden_file(golden_dir: PathLike, case_id: str, platform: str,
                environment: Optional[str] = None) -> Path:
    return Path(golden_dir) / case_id / f"golden_values_{golden_key(platform, environment)}.json"


# A golden file of another kernel identity beside the key's own: golden_values_<key>.<variant>.json
VARIANT_SEP = "."


def variant_name(env: Optional[RunEnvironment]) -> str:
    """The name a golden file of ``env``'s kernel identity takes beside the others of its key
    (``golden_values_cpu.avx2.json``): on CPU the ATen capability, with MKL's branch where it is
    not the harness's pinned one (``-mkl7``) and the intra-op threads where not 1 (``-t2``); on
    CUDA the compute capability and CUDA version (``sm_90-cu12.8``)."""
    kernels = kernels_of(env)[0] if env is not None else {}
    if "aten_cpu_capability" in kernels:
        name = kernels["aten_cpu_capability"].lower()
        if kernels.get("blas_isa") not in (None, "0"):
            name += f"-mkl{kernels['blas_isa']}"
        if kernels.get("intra_op_threads") not in (None, "1"):
            name += f"-t{kernels['intra_op_threads']}"
        return name
    if "capability" in kernels:
        return f"{kernels['capability']}-cu{kernels.get('cuda', 'x')}".lower()
    return "unknown"


def keys_of(files: Iterable[str], key: str) -> list[str]:
    """The keys among ``files`` that hold values of ``key``: ``key`` itself first, then its
    side-by-side files of other kernel identities (``<key>.<variant>``), sorted."""
    return sorted((k for k in files if k == key or k.startswith(key + VARIANT_SEP)),
                  key=lambda k: (k != key, k))


def same_kernels(golden: "Golden", env: Optional[RunEnvironment]) -> bool:
    """Whether ``env`` (a run's environment) takes the kernels ``golden`` was recorded with."""
    if golden.environment is None or env is None:
        return False
    return not kern.differences(kernels_of(golden.environment)[0], kernels_of(env)[0])


def pick_kernels(candidates: Sequence["Golden"], env: Optional[RunEnvironment]) -> "Golden":
    """Of the golden files of one key (the key's own first, :func:`keys_of`), the one recorded
    with ``env``'s kernels, else the key's own (else the first): side-by-side files of other
    kernel identities, the matching one chosen."""
    return next((g for g in candidates if same_kernels(g, env)), candidates[0])


_GOLDEN_NAME = re.compile(r"^golden_values_([a-z0-9][a-z0-9._-]*)\.json$")
# Words of a CUDA device name that say nothing about the chip ("NVIDIA GeForce RTX 4090").
_VENDOR_WORDS = ("nvidia", "geforce", "tesla", "quadro")
AUTO_ENVIRONMENT = "auto"


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


def _major_minor(version: str) -> str:
    parts = re.findall(r"\d+", version)
    return ".".join(parts[:2]) if parts else "unknown"


def environment_key(env: RunEnvironment) -> str:
    """The environment part of a golden key (``compare.golden.environment: auto``): the torch and
    CUDA versions, major.minor: ``torch2.11-cu13.0``, ``torch2.13-cpu`` (a CPU build)."""
    cuda = f"cu{_major_minor(env.cuda)}" if env.cuda else "cpu"
    return f"torch{_major_minor(env.torch)}-{cuda}"


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


def kernels_of(env: RunEnvironment) -> tuple[dict[str, str], bool]:
    """The kernel identity an environment names (``harness.kernels``) and whether it is the whole
    one the rank probed (False: derived from an environment recorded before it was,
    :func:`harness.kernels.legacy`)."""
    if env.kernels:
        return dict(env.kernels), True
    return dict(kern.legacy(env.torch, env.device_name, env.cuda, dict(env.settings))), False


def run_devices(steps: Steps) -> tuple[str, ...]:
    """The devices (``RunEnvironment.device_id``) the arm's ranks recorded, sorted, each once;
    empty for records that name none (older runs)."""
    found = set()
    for rank in steps:
        env = next((rec.environment for rec in steps[rank] if rec.environment is not None), None)
        if env is not None and env.device_id:
            found.add(env.device_id)
    return tuple(sorted(found))


def resolve_environment(name: Optional[str], steps: Steps) -> Optional[str]:
    """The environment part of the golden key: ``name``, or for ``auto`` the records' own
    (:func:`environment_key`); ValueError when ``auto`` finds no recorded environment."""
    if name != AUTO_ENVIRONMENT:
        return name
    env = environment_of(steps)
    if env is None:
        raise ValueError("compare.golden.environment is auto but the arm's records name no "
                         "environment (written by an older dcp-harness); re-run the arm")
    return environment_key(env)


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


def _entry(values: Mapping[int, float]) -> dict[str, Any]:
    steps = sorted(values)
    return {"start_step": steps[0], "end_step": steps[-1], "step_interval": 1,
            "values": {str(s): values[s] for s in steps}}


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


def golden_values(runs: Union[Steps, Sequence[Steps]], *,
                  window: Optional[Sequence[int]] = None, arm: Optional[str] = None,
                  inherited_env: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """The golden document of one arm's records, or of N repeats of it (metrics only where they
    were recorded; memory: CUDA runs only). With N runs ``values`` is the per-step median and
    each entry also holds ``repeats``, ``min``, ``max``, ``cv`` and, for step time and memory,
    ``rtol`` (``window``: the step time's steady window, default :func:`steady_window`).
    Every entry names the ``arm`` the values came from and, for a command arm, the environment
    its command inherited (``inherited_env``, the first run's ``inherited_env.json``), so a check
    of another arm, or in another shell, says so."""
    all_runs: list[Steps] = [runs] if isinstance(runs, Mapping) else list(runs)
    if not all_runs:
        raise GoldenError("no run to keep as golden values")
    doc: dict[str, Any] = {}
    env = environment_of(all_runs[0])
    for m in METRICS:
        series = [metric_series(r, m.name) for r in all_runs]
        if not series[0]:
            continue
        steps = sorted(series[0])
        for k, other in enumerate(series[1:], start=2):
            if sorted(other) != steps:
                raise GoldenError(f"repeat {k} of the arm recorded '{m.name}' on steps other than "
                                  "the first run's; every repeat must finish every step")
        entry = _entry({s: statistics.median([r[s] for r in series]) for s in steps})
        if len(series) > 1:
            spread = measure_spread(m.name, series, steady_window(steps[-1], window)
                                    if m.kind == TIME else None)
            entry.update(repeats=len(series), cv=spread.cv,
                         min={str(s): min(r[s] for r in series) for s in steps},
                         max={str(s): max(r[s] for r in series) for s in steps})
            if m.kind != LOSS:
                entry["rtol"] = spread.rtol
            if m.kind == TIME:
                devices = {d for r in all_runs for d in run_devices(r)}
                if devices:
                    entry["devices"] = sorted(devices)
        if env is not None:
            entry["environment"] = record_json(env)
        if arm is not None:
            entry["arm"] = arm
        if inherited_env is not None:
            entry["inherited_env"] = dict(sorted(inherited_env.items()))
        doc[m.name] = entry
    if "lm loss" not in doc:
        raise GoldenError("the arm recorded no loss: nothing to keep as golden values")
    return doc


def covered(golden: Golden, metric: str, run: Mapping[int, float], arm: str, steps: int
            ) -> Mapping[int, float]:
    """The golden series of ``metric``, checked to cover the case's steps (``steps``, for a
    metric of every step; the graph pool and the memory probe are one step's) and every step
    the arm recorded it on; GoldenError otherwise. Steps the arm did not record (it crashed) are
    left to its completeness check. A metric its source gives at some steps only (a command's
    memory lines, logged at the first iterations) is held to the steps the arm has: its file
    may end before the case's last step, never after it."""
    want = golden.series(metric)
    every_step = len(want) > 1 or len(run) > 1
    reaches = bool(run) and max(run) == steps  # the arm has the metric at the last step
    if want and every_step and max(want) != steps and (reaches or max(want) > steps):
        raise GoldenError(f"{golden.path}: '{metric}' runs to step {max(want)}, the case to "
                          f"train.steps {steps} (train.steps changed? re-record it)")
    if set(run) - set(want):
        raise GoldenError(f"{golden.path}: '{metric}' has no value for step(s) "
                          f"{collapse_runs(sorted(set(run) - set(want)))} of arm '{arm}' (the case "
                          "changed? re-record it)")
    return want


# The golden check's loss bounds where the case gives none and the run is not one that repeats
# its golden values bitwise (below): Megatron's functional tests' loss tolerance, 10x for the
# grad norm.
LOSS_DEFAULTS: Mapping[str, LossBound] = MappingProxyType({
    "lm loss": Tolerance(max_rel=1e-5), "aux loss": Tolerance(max_rel=1e-5),
    "grad norm": Tolerance(max_rel=1e-4)})


def loss_bound(golden: Golden, metric: str, declared: Optional[LossBound], setting: str,
               not_bitwise: Optional[str], same: str = "") -> tuple[LossBound, str, str]:
    """The bound of loss metric ``metric`` against ``golden``, where it comes from, and its kind
    (``Check.bound_kind``): the case's (``declared``, its field ``setting``: ``declared``); else,
    for a run that repeats its golden values bitwise (``not_bitwise`` None: a deterministic run
    with the kernels the file was recorded with, ``same`` says which), ``exact`` (``bitwise``),
    or the spread of the file's repeats x ``RTOL_FACTOR`` where they did not agree bitwise
    (``repeats``); else :data:`LOSS_DEFAULTS` (``fallback``; ``not_bitwise`` says why)."""
    if declared is not None:
        return declared, setting, "declared"
    if not_bitwise is not None:
        default = LOSS_DEFAULTS[metric]
        return default, f"fallback to the default rel {default.max_rel:g}: {not_bitwise}", "fallback"
    spread, repeats = golden.spreads.get(metric, 0.0), golden.repeats.get(metric, 1)
    if spread > 0:
        return (Tolerance(max_rel=RTOL_FACTOR * spread),
                f"{RTOL_FACTOR:g} x the spread {spread:.3g} of the golden file's {repeats} repeats",
                "repeats")
    agreed = f"; the golden file's {repeats} repeats agreed bitwise" if repeats > 1 else ""
    return "exact", ("bitwise: a deterministic run repeats its golden values with the kernels they "
                     f"were recorded with{f' ({same})' if same else ''}{agreed}"), "bitwise"


def _bound_allows(bound: LossBound, low: float, high: float, ref: float) -> bool:
    """Whether two repeats giving ``low`` and ``high`` agree under the check's own ``bound``."""
    if bound == "exact":
        return low == high
    tol = bound if isinstance(bound, Tolerance) else Tolerance.model_validate(bound)
    return high - low <= (tol.max_abs or 0.0) + (tol.max_rel or 0.0) * abs(ref)


def refusals(runs: Sequence[Steps], *, loss_bounds: Mapping[str, Optional[LossBound]],
             checked: Container[str], window: Optional[Sequence[int]] = None,
             max_cv: float = MAX_CV) -> list[str]:
    """Why N repeats of an arm are too unsteady to keep as golden values (empty: keep them), one
    line per metric: a loss metric whose repeats disagree by more than the golden check's own
    bound (``loss_bounds``: metric -> bound, None: :data:`LOSS_DEFAULTS`; such a golden file
    could not pass its own check),
    or a step-time / memory metric the verdict checks (``checked``) whose std/mean over the
    repeats is above ``max_cv`` (Megatron's 2 %: its bound would be wider than what it is meant
    to catch)."""
    out: list[str] = []
    if len(runs) < 2:
        return out
    for m in METRICS:
        series = [metric_series(r, m.name) for r in runs]
        if not series[0]:
            continue
        if m.kind == LOSS:
            if m.name not in loss_bounds:
                continue
            given = loss_bounds[m.name]
            bound = LOSS_DEFAULTS[m.name] if given is None else given
            for step in sorted(series[0]):
                vals = [r[step] for r in series if step in r]
                if not _bound_allows(bound, min(vals), max(vals), statistics.median(vals)):
                    shown = bound if bound == "exact" else f"{bound}"
                    out.append(f"'{m.name}' differs between the {len(runs)} repeats at step {step} "
                               f"({', '.join(f'{v:.9g}' for v in vals)}) by more than the golden "
                               f"check allows ({shown}): the run does not repeat, so no golden "
                               "value of it can pass; make it deterministic or loosen the bound")
                    break
        elif m.name in checked:
            last = max(series[0])
            spread = measure_spread(m.name, series, steady_window(last, window)
                                    if m.kind == TIME else None)
            if spread.cv > max_cv:
                out.append(f"'{m.name}' varies too much between the {len(runs)} repeats: std/mean "
                           f"{spread.cv:.2%} > {max_cv * 100:g}% ({spread.where}); a bound from this "
                           "spread would hide what it should catch. Record on a quiet machine "
                           "(nothing else on its GPUs/CPUs), or switch the check off for this "
                           "platform (compare.golden.step_time / memory: null)")
    return out


def write_golden(path: PathLike, runs: Union[Steps, Sequence[Steps]], *,
                 window: Optional[Sequence[int]] = None, arm: Optional[str] = None,
                 inherited_env: Optional[Mapping[str, str]] = None) -> Path:
    path = Path(path)
    doc = golden_values(runs, window=window, arm=arm, inherited_env=inherited_env)  # first: a refused document leaves no folder behind
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, doc)
    return path


Finite = Annotated[float, Field(allow_inf_nan=False, strict=False)]
Steps_ = dict[int, Finite]  # step -> value; JSON's "1" keys read as 1


class GoldenEntry(BaseModel):
    """One metric's entry of a golden file, as read back: Megatron-LM's four keys and what
    dcp-harness keeps beside them (module doc). Keys neither knows are ignored (a Megatron-style
    file may hold more); a value of the wrong kind is refused, naming the field."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    start_step: Optional[int] = None
    end_step: Optional[int] = None
    step_interval: Optional[int] = None
    values: Steps_ = Field(min_length=1)
    # from N repeats: the per-step extremes, std/mean, the bound (time, memory), the devices
    min: Optional[Steps_] = None
    max: Optional[Steps_] = None
    cv: Optional[Finite] = None
    rtol: Optional[Annotated[float, Field(ge=0, allow_inf_nan=False)]] = None
    repeats: Optional[Annotated[int, Field(ge=0)]] = None
    devices: Optional[tuple[Annotated[str, Field(min_length=1)], ...]] = None
    environment: Optional[RunEnvironment] = None
    arm: Optional[Annotated[str, Field(min_length=1)]] = None
    inherited_env: Optional[dict[str, str]] = None

    def spread(self) -> Optional[float]:
        """The largest ``|min or max - value| / |value|`` over the steps of an entry recorded
        from repeats (None: it has no ``min`` and ``max``)."""
        if self.min is None or self.max is None:
            return None
        worst = 0.0
        for step, value in self.values.items():
            far = max(abs(self.min.get(step, value) - value), abs(self.max.get(step, value) - value))
            worst = max(worst, far / abs(value) if value else (0.0 if far == 0 else math.inf))
        return worst


def read_entries(path: Path, doc: Any) -> dict[str, GoldenEntry]:
    """A golden document's entries, typed (``results.typed.read_typed``); GoldenError naming
    ``path`` and the metric."""
    if not isinstance(doc, Mapping):
        raise GoldenError(f"{path}: expected a JSON object of metric -> entry")
    out = {}
    for metric, raw in doc.items():
        try:
            out[metric] = read_typed(GoldenEntry, raw, "entry", nonfinite=False)
        except ResultsError as exc:
            raise GoldenError(f"{path}: metric '{metric}': {exc}; re-record it with "
                              "`dcp-harness golden record`") from None
    return out


def golden_from_document(path: PathLike, doc: Any) -> Golden:
    """A golden document (a file's parsed JSON) read back; GoldenError naming ``path``."""
    path = Path(path)
    entries = read_entries(path, doc)
    arms = {e.arm for e in entries.values()} - {None}
    if len(arms) > 1:
        raise GoldenError(f"{path}: the entries' 'arm' must be one arm name for the whole file, "
                          f"got {sorted(map(repr, arms))}; re-record it with `dcp-harness golden "
                          "record`")

    def each(get: Callable[[GoldenEntry], Any]) -> MappingProxyType:
        return MappingProxyType({m: v for m, e in entries.items() if (v := get(e)) is not None})

    environment = next((e.environment for e in entries.values() if e.environment is not None), None)
    inherited = next((e.inherited_env for e in entries.values() if e.inherited_env is not None),
                     None)
    return Golden(path, each(lambda e: dict(sorted(e.values.items()))), each(lambda e: e.rtol),
                  each(lambda e: e.repeats), environment, each(lambda e: e.devices),
                  each(GoldenEntry.spread), next(iter(arms), None),
                  None if inherited is None else MappingProxyType(dict(inherited)))


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
    """Key (platform, or ``<environment>_<platform>``) -> a copy of
    ``<golden_dir>/<case_id>/golden_values_<key>.json``, for every key that has a file there ({}
    when none does)."""
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
