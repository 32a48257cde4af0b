"""Drift: a figure judged across a window of sweeps, its own spread taken as the noise.

Over the last ``window`` points of a series (those of the newest definition of the case: the
same case hash), a robust straight line is fitted (Theil-Sen: the median of the slopes between
every two points, the intercept the median of what is left). Its rise over the window, relative
to its value at the window's start, is the **change**; the noise is the spread of the points about
the line (1.4826 x the median absolute deviation of the residuals). A figure **drifted** when the
change goes the bad way by more than ``max_drift`` and by more than 3 x the noise; the same the
other way is **moved** (better: a note, not a failure). It **moved at** the first sweep after
which every point stays beyond the band (3 x noise, at least half the bound) around the start.
A series of fewer than ``min_points`` points is **too few**: said, never passed silently.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal, Optional, Sequence

from .query import Point, SeriesKey

DEFAULT_WINDOW = 10
DEFAULT_MAX_DRIFT_PCT = 5.0
MIN_POINTS = 4
NOISE_SIGMAS = 3.0
MAD_TO_SIGMA = 1.4826  # a normal distribution's sigma per median absolute deviation

# Figures where higher is worse (time, memory; a check's value, which passes under its bound);
# the others (loss, capture counts) drift either way.
HIGHER_IS_WORSE = ("step_time_median_s", "peak_allocated_bytes", "peak_reserved_bytes",
                   "device_used_bytes", "graph_pool_bytes", "wall_s")

Verdict = Literal["drift", "moved", "steady", "too-few"]


@dataclass(frozen=True)
class Judged:
    key: SeriesKey
    verdict: Verdict
    points: tuple[Point, ...]
    change: float = 0.0  # relative change over the window (inf: from 0)
    noise: float = 0.0  # relative noise (the spread about the line)
    moved_at: Optional[Point] = None

    def line(self) -> str:
        n = len(self.points)
        if self.verdict == "too-few":
            return (f"TOO FEW {self.key.label}: {n} point(s) of the {MIN_POINTS} a trend needs; "
                    "not judged")
        size = "from 0" if math.isinf(self.change) else f"{self.change * 100:+.1f}%"
        where = ""
        if self.moved_at is not None:
            where = (f"; moved first at sweep {self.moved_at.sweep} ({self.moved_at.started}, "
                     f"{self.moved_at.commit_label})")
        head = {"drift": "DRIFT  ", "moved": "MOVED  ", "steady": "steady "}[self.verdict]
        return (f"{head}{self.key.label}: {size} over {n} sweeps "
                f"(noise {self.noise * 100:.1f}%){where}")


def theil_sen(ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of the Theil-Sen line through (i, ys[i])."""
    n = len(ys)
    slopes = [(ys[j] - ys[i]) / (j - i) for i in range(n) for j in range(i + 1, n)]
    slope = statistics.median(slopes) if slopes else 0.0
    intercept = statistics.median(y - slope * i for i, y in enumerate(ys))
    return intercept, slope


def _bad_way(metric: str, change: float) -> bool:
    return change > 0 if metric in HIGHER_IS_WORSE else change != 0


def judge_series(key: SeriesKey, points: Sequence[Point], *, window: int = DEFAULT_WINDOW,
                 max_drift: float = DEFAULT_MAX_DRIFT_PCT / 100,
                 min_points: int = MIN_POINTS) -> Judged:
    """The verdict of one series (points oldest first) over its last ``window`` points of the
    newest case definition."""
    pts = list(points)[-window:]
    start = len(pts)
    while start > 0 and pts[start - 1].case_hash == pts[-1].case_hash:
        start -= 1
    pts = pts[start:]
    if len(pts) < min_points:
        return Judged(key, "too-few", tuple(pts))
    ys = [p.value for p in pts]
    intercept, slope = theil_sen(ys)
    rise = slope * (len(ys) - 1)
    residuals = [y - (intercept + slope * i) for i, y in enumerate(ys)]
    mid = statistics.median(residuals)
    sigma = MAD_TO_SIGMA * statistics.median(abs(r - mid) for r in residuals)
    base = abs(intercept)
    change = rise / base if base else (math.inf if rise else 0.0)
    noise = sigma / base if base else 0.0
    beyond = abs(change) > max_drift and abs(rise) > NOISE_SIGMAS * sigma
    if not beyond:
        return Judged(key, "steady", tuple(pts), change, noise)
    band = max(NOISE_SIGMAS * sigma, max_drift / 2 * base)
    sign = 1 if rise > 0 else -1
    first: Optional[int] = None
    for i in range(len(ys) - 1, 0, -1):
        if sign * (ys[i] - intercept) <= band:
            break
        first = i
    verdict: Verdict = "drift" if _bad_way(key.metric, rise) else "moved"
    return Judged(key, verdict, tuple(pts), change, noise,
                  pts[first] if first is not None else None)


@dataclass(frozen=True)
class DriftReport:
    judged: tuple[Judged, ...]
    window: int
    max_drift: float

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
        return 2 if len(self.too_few) == len(self.judged) else 0

    def lines(self, *, verbose: bool = False) -> list[str]:
        judged = len(self.judged) - len(self.too_few)
        status = {0: "PASS", 1: "FAIL", 2: "ERROR"}[self.exit_code]
        head = (f"history check: {status} (exit {self.exit_code}): {len(self.judged)} figure(s), "
                f"{judged} judged over the last {self.window} sweeps (max drift "
                f"{self.max_drift * 100:g}%): {len(self.drifted)} drifted, "
                f"{sum(j.verdict == 'moved' for j in self.judged)} moved the better way, "
                f"{len(self.too_few)} with too few points")
        if not self.judged:
            head += "; the history holds no figures to judge (add sweeps: `dcp-harness history add`)"
        elif self.exit_code == 2:
            head += f"; nothing could be judged (a trend needs {MIN_POINTS} sweeps)"
        shown = [j for j in self.judged if verbose or j.verdict != "steady"]
        return [head] + ["  " + j.line() for j in sorted(shown, key=_order)]


def _order(j: Judged) -> tuple:
    return ({"drift": 0, "moved": 1, "too-few": 2, "steady": 3}[j.verdict], j.key)


def check(series: dict[SeriesKey, list[Point]], *, window: int = DEFAULT_WINDOW,
          max_drift: float = DEFAULT_MAX_DRIFT_PCT / 100, min_points: int = MIN_POINTS
          ) -> DriftReport:
    return DriftReport(tuple(judge_series(k, pts, window=window, max_drift=max_drift,
                                          min_points=min_points)
                             for k, pts in sorted(series.items())), window, max_drift)
