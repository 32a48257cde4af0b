"""Drift: a figure judged across a window of sweeps against the noise it really has.

Over the last ``window`` points of a series (those of the newest definition of the case: the same
case hash; in commit order, ``query.in_commit_order``), the rule looks for the earliest sweep
after which the figure left its level and stayed away:

* the **level** is the median of the points before a candidate start (at least 2);
* the **noise** (a sigma) is the largest of what the sweeps measured themselves (a step-time
  median's standard error from the spread of its steps: ``figures.spread``), the spread of the
  points before the start (1.4826 x their median absolute deviation, from 3 points on) and the
  **floor** of the figure's kind on its platform (:data:`FLOORS`, measured over clean sweeps on a
  loaded host: ``bench/drift_noise.py``, ``bench/RESULTS.md``);
* the **bound** is the larger of 3 x the noise and the change that matters for the kind
  (:data:`MATTERS`, or ``--max-drift``);
* the figure **moved** at the earliest start from which every later point lies beyond half the
  bound the same way and the last two beyond the whole bound (one sweep alone never decides:
  a machine busy for one sweep is not a regression). The bad way (up for time and memory, either
  way for the loss and the capture counts) is **drift**, the other way a note (**moved**).

What is judged is chosen per platform: on a GPU the step-time median (wall clock, synchronized);
on CPU the process CPU time per step (``step_cpu_median_s``), which the neighbours of a shared
host move far less than the wall clock. The other one, and ``wall_s`` (process start, imports and
compile included: not a step time) are **shown**, never judged. A series of fewer than
:data:`MIN_POINTS` points is **too few**: said, never passed silently.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal, Optional, Sequence

from .query import Point, SeriesKey

DEFAULT_WINDOW = 10
MIN_POINTS = 4  # a level (2 points) and a move that stayed (2 points)
NOISE_SIGMAS = 3.0
MAD_TO_SIGMA = 1.4826  # a normal distribution's sigma per median absolute deviation
CPU = "cpu"

Kind = Literal["time", "memory", "loss", "count", "wall"]
KINDS: dict[str, Kind] = {
    "step_time_median_s": "time", "step_cpu_median_s": "time", "wall_s": "wall",
    "peak_allocated_bytes": "memory", "peak_reserved_bytes": "memory",
    "device_used_bytes": "memory", "graph_pool_bytes": "memory", "final_loss": "loss",
    "capture_variants": "count", "capture_physical_slots": "count", "capture_graphs": "count",
    "capture_pools": "count",
}
HIGHER_IS_WORSE = ("time", "memory", "wall")

# The step-time figure judged per platform (the other is shown): on CPU the process CPU time
# per step, which neighbours move less (bench/RESULTS.md, "Drift noise"), on a GPU the wall clock.
JUDGED_TIME = {CPU: "step_cpu_median_s"}
DEFAULT_JUDGED_TIME = "step_time_median_s"

# The change that matters per kind (relative to the level; count: any change of one or more).
MATTERS: dict[Kind, float] = {"time": 0.05, "memory": 0.03, "loss": 0.005, "count": 0.0}
# The least noise (relative sigma) a kind has on CPU or on a GPU, whatever a short window shows:
# measured over clean sweeps on the loaded 2-core CPU host (bench/drift_noise.py; bench/RESULTS.md,
# "Drift noise"): there the CPU time per step of a 2-rank arm doubled when the host's load went
# from 3 to 13 (the ranks spin while they wait for each other), so only 30 % kept every clean
# check quiet. GPU: the static-path perf case repeats to 1 % (bench/RESULTS.md).
FLOORS: dict[tuple[Kind, bool], float] = {
    ("time", True): 0.30, ("time", False): 0.01,
    ("memory", True): 0.002, ("memory", False): 0.002,
    ("loss", True): 0.0005, ("loss", False): 0.0005,
    ("count", True): 0.0, ("count", False): 0.0,
}
COUNT_STEP = 0.5  # a capture count moved when it changed by one or more (the bound, absolute)

Verdict = Literal["drift", "moved", "steady", "too-few", "shown"]


def kind_of(metric: str) -> Optional[Kind]:
    return KINDS.get(metric)


def is_judged(key: SeriesKey) -> bool:
    """Whether the drift rule judges this figure (else it is shown only): wall time never; of
    the two step times the one judged on the key's platform; a figure of unknown kind never."""
    kind = kind_of(key.metric)
    if kind is None or kind == "wall":
        return False
    if kind == "time":
        return key.metric == JUDGED_TIME.get(key.platform, DEFAULT_JUDGED_TIME)
    return True


def _bad_way(metric: str, change: float) -> bool:
    return change > 0 if kind_of(metric) in HIGHER_IS_WORSE else change != 0


@dataclass(frozen=True)
class Judged:
    key: SeriesKey
    verdict: Verdict
    points: tuple[Point, ...]
    change: float = 0.0  # relative change of the newest point from the level (inf: from 0)
    noise: float = 0.0  # relative sigma the figure was judged against
    moved_at: Optional[Point] = None
    level: Optional[float] = None  # the level before the move (or of the whole window)
    bound: Optional[float] = None  # absolute: beyond level +- bound is a move

    def line(self) -> str:
        n = len(self.points)
        if self.verdict == "too-few":
            return (f"TOO FEW {self.key.label}: {n} point(s) of the {MIN_POINTS} a trend needs; "
                    "not judged")
        if self.verdict == "shown":
            return f"shown   {self.key.label}: {n} point(s), not judged ({_why_shown(self.key)})"
        size = "from 0" if math.isinf(self.change) else f"{self.change * 100:+.1f}%"
        bound = ""
        if self.level and self.bound is not None:
            bound = f", bound {self.bound / abs(self.level) * 100:.1f}%"
        where = ""
        if self.moved_at is not None:
            where = (f"; moved first at sweep {self.moved_at.sweep} "
                     f"({self.moved_at.commit_label}, {self.moved_at.started})")
        head = {"drift": "DRIFT  ", "moved": "MOVED  ", "steady": "steady "}[self.verdict]
        return (f"{head}{self.key.label}: {size} over {n} sweeps "
                f"(noise {self.noise * 100:.1f}%{bound}){where}")


def _why_shown(key: SeriesKey) -> str:
    kind = kind_of(key.metric)
    if kind == "wall":
        return "wall time includes process start, imports and compile: not a step time"
    if kind == "time":
        judged = JUDGED_TIME.get(key.platform, DEFAULT_JUDGED_TIME)
        return f"on {key.platform or 'this platform'} {judged} is the step time judged"
    return "no drift rule for this figure"


def _sigma(values: Sequence[float]) -> float:
    mid = statistics.median(values)
    return MAD_TO_SIGMA * statistics.median(abs(v - mid) for v in values)


def _newest_definition(points: Sequence[Point], window: int) -> list[Point]:
    pts = list(points)[-window:]
    start = len(pts)
    while start > 0 and pts[start - 1].case_hash == pts[-1].case_hash:
        start -= 1
    return pts[start:]


@dataclass(frozen=True)
class Noise:
    """What a series is judged against at one candidate start: level, sigma, bound (absolute)."""

    level: float
    sigma: float
    bound: float


def noise_at(key: SeriesKey, pts: Sequence[Point], start: int,
             matters: Optional[float] = None) -> Noise:
    """The level, noise and bound of ``pts`` with the move starting at ``start`` (the points
    before it are the level's)."""
    kind = kind_of(key.metric) or "time"
    base = [p.value for p in pts[:start]]
    level = statistics.median(base)
    scale = abs(level)
    sigmas = [FLOORS.get((kind, key.platform == CPU), 0.0) * scale]
    if len(base) >= 3:
        sigmas.append(_sigma(base))
    spreads = [p.spread for p in pts if p.spread is not None and math.isfinite(p.spread)]
    if spreads:
        sigmas.append(statistics.median(spreads))
    sigma = max(sigmas)
    size = MATTERS.get(kind, 0.05) if matters is None else matters
    bound = max(NOISE_SIGMAS * sigma, size * scale)
    if kind == "count":
        bound = max(bound, COUNT_STEP)
    return Noise(level, sigma, bound)


def judge_series(key: SeriesKey, points: Sequence[Point], *, window: int = DEFAULT_WINDOW,
                 max_drift: Optional[float] = None, min_points: int = MIN_POINTS) -> Judged:
    """The verdict of one series (points oldest first) over its last ``window`` points of the
    newest case definition. ``max_drift``: the change that matters (relative), for every kind
    (None: :data:`MATTERS` per kind)."""
    pts = _newest_definition(points, window)
    if not is_judged(key):
        return Judged(key, "shown", tuple(pts))
    if len(pts) < min_points:
        return Judged(key, "too-few", tuple(pts))
    ys = [p.value for p in pts]
    n = len(ys)
    for start in range(2, n - 1):  # the earliest start that explains the newest points
        nz = noise_at(key, pts, start, max_drift)
        for sign in (1, -1):
            away = [sign * (y - nz.level) for y in ys[start:]]
            if min(away) > nz.bound / 2 and min(away[-2:]) > nz.bound:
                rise = ys[-1] - nz.level
                change = rise / abs(nz.level) if nz.level else math.inf
                verdict: Verdict = "drift" if _bad_way(key.metric, rise) else "moved"
                return Judged(key, verdict, tuple(pts), change,
                              nz.sigma / abs(nz.level) if nz.level else 0.0, pts[start],
                              nz.level, nz.bound)
    nz = noise_at(key, pts, n, max_drift)  # steady: the whole window is the level
    change = (ys[-1] - nz.level) / abs(nz.level) if nz.level else 0.0
    return Judged(key, "steady", tuple(pts), change,
                  nz.sigma / abs(nz.level) if nz.level else 0.0, None, nz.level, nz.bound)


@dataclass(frozen=True)
class DriftReport:
    judged: tuple[Judged, ...]
    window: int
    max_drift: Optional[float]
    label: Optional[str] = None  # the label whose sweeps were judged (None: every label)
    others: tuple[tuple[str, int], ...] = ()  # the other labels in the history: (label, sweeps)

    def count(self, verdict: Verdict) -> int:
        return sum(j.verdict == verdict for j in self.judged)

    @property
    def drifted(self) -> tuple[Judged, ...]:
        return tuple(j for j in self.judged if j.verdict == "drift")

    @property
    def too_few(self) -> tuple[Judged, ...]:
        return tuple(j for j in self.judged if j.verdict == "too-few")

    @property
    def exit_code(self) -> int:
        """The gate's codes: 1 a figure drifted; 2 nothing could be judged; else 0."""
        if self.drifted:
            return 1
        return 2 if not any(j.verdict in ("steady", "moved") for j in self.judged) else 0

    def lines(self, *, verbose: bool = False) -> list[str]:
        """The drifts first (each with its size, noise, bound and where it moved), then one line
        counting the rest; every figure under ``verbose``."""
        status = {0: "PASS", 1: "FAIL", 2: "ERROR"}[self.exit_code]
        bound = ("max drift per kind" if self.max_drift is None
                 else f"max drift {self.max_drift * 100:g}%")
        of = f" of label '{self.label}'" if self.label else ""
        head = (f"history check: {status} (exit {self.exit_code}): {len(self.drifted)} drifted "
                f"of {len(self.judged)} figure(s) over the last {self.window} sweeps{of} "
                f"({bound})")
        if not self.judged:
            head += "; the history holds no figures to judge (add sweeps: `dcp-harness history add`)"
        elif self.exit_code == 2:
            head += f"; nothing could be judged (a trend needs {MIN_POINTS} sweeps)"
        shown = [j for j in self.judged if verbose or j.verdict in ("drift", "moved")]
        out = [head] + ["  " + j.line() for j in sorted(shown, key=_order)]
        out.append(f"  {self.count('steady')} steady, {self.count('moved')} moved the better way, "
                   f"{self.count('too-few')} with too few points, {self.count('shown')} shown "
                   "only (wall time; the step time not judged on the platform)"
                   + ("" if verbose else "; -v lists them"))
        if self.others:
            listed = ", ".join(f"{name} ({n} sweep(s))" for name, n in self.others)
            out.append(f"  other labels, not judged here: {listed}; judge one with --label L")
        return out


def _order(j: Judged) -> tuple:
    return ({"drift": 0, "moved": 1, "too-few": 2, "steady": 3, "shown": 4}[j.verdict], j.key)


def check(series: dict[SeriesKey, list[Point]], *, window: int = DEFAULT_WINDOW,
          max_drift: Optional[float] = None, min_points: int = MIN_POINTS,
          label: Optional[str] = None, others: Sequence[tuple[str, int]] = ()) -> DriftReport:
    return DriftReport(tuple(judge_series(k, pts, window=window, max_drift=max_drift,
                                          min_points=min_points)
                             for k, pts in sorted(series.items())), window, max_drift, label,
                       tuple(others))
