"""The golden file: its typed model (:class:`GoldenEntry` per metric, read through
``results.read_typed``; :class:`Golden`, a file read back), its writer (:func:`golden_values`,
:func:`write_golden`: one run, or the median and spread of N repeats) and reader
(:func:`read_golden`, :func:`golden_from_document`), and which file of a key fits a run's kernels
(:func:`same_kernels`, :func:`pick_kernels`). Pure Python: no torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Callable, Mapping, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field

from harness import kernels as kern
from harness.results import (
    PathLike,
    ResultsError,
    RunEnvironment,
    read_json,
    read_typed,
    record_json,
    write_json_atomic,
)

from .keys import kernels_of
from .metrics import (LOSS, METRICS, TIME, Steps, environment_of, metric_series, run_devices,
                      steady_window)
from .spread import measure_spread


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


def _entry(values: Mapping[int, float]) -> dict[str, Any]:
    steps = sorted(values)
    return {"start_step": steps[0], "end_step": steps[-1], "step_interval": 1,
            "values": {str(s): values[s] for s in steps}}


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


def same_kernels(golden: Golden, env: Optional[RunEnvironment]) -> bool:
    """Whether ``env`` (a run's environment) takes the kernels ``golden`` was recorded with."""
    if golden.environment is None or env is None:
        return False
    return not kern.differences(kernels_of(golden.environment)[0], kernels_of(env)[0])


def pick_kernels(candidates: Sequence[Golden], env: Optional[RunEnvironment]) -> Golden:
    """Of the golden files of one key (the key's own first, :func:`keys_of`), the one recorded
    with ``env``'s kernels, else the key's own (else the first): side-by-side files of other
    kernel identities, the matching one chosen."""
    return next((g for g in candidates if same_kernels(g, env)), candidates[0])
