"""Golden review: what a refreshed golden file changes, per metric (``dcp-harness golden diff``).

For the pull request that refreshes golden values, as Megatron-LM reviews a new golden file
against the committed one: per metric over the steps both files hold, the signed mean relative
difference (NEW - OLD) / |OLD| and the largest one with its step; for step time also the
difference of the medians over the steady window (what the verdict compares), and the bound each
file carries (``rtol``); the metrics and steps only one of them has, and what changed in the
recorded environment. A review may choose its metrics (``diff_golden(..., metrics=...)``) and, over
two folders, the platform of the files (:func:`on_platform`); :func:`diff_files` pairs the files
of two folders (or takes two files) and diffs each. Pure Python.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Iterator, Optional

from harness.environment import differences
from harness.errors import ConfigError
from harness.golden import (TIME_METRIC, Golden, GoldenError, METRIC, read_golden, steady_window,
                            window_median)
from harness.textfmt import collapse_runs


@dataclass(frozen=True)
class MetricDiff:
    """One metric of both files: over their common steps, the signed mean and the largest
    relative difference (NEW vs OLD) with its step; for step time the window medians' too."""

    metric: str
    steps: int
    mean_rel: float
    largest_rel: float
    largest_step: int
    only_old: tuple[int, ...] = ()
    only_new: tuple[int, ...] = ()
    window: Optional[tuple[int, int]] = None
    window_rel: Optional[float] = None
    old_rtol: Optional[float] = None
    new_rtol: Optional[float] = None


@dataclass(frozen=True)
class GoldenDiff:
    old: Golden
    new: Golden
    metrics: tuple[MetricDiff, ...]
    only_old: tuple[str, ...]
    only_new: tuple[str, ...]
    environment: tuple[str, ...]  # what changed; empty: the same, or not recorded
    environment_known: bool

    def largest(self) -> float:
        """The largest |relative difference| over every metric (0 when none differs)."""
        return max((abs(m.largest_rel) for m in self.metrics), default=0.0)

    def coverage_changed(self) -> bool:
        """A metric, or a step of one, that only one of the two files holds."""
        return bool(self.only_old or self.only_new
                    or any(m.only_old or m.only_new for m in self.metrics))


def _rel(new: float, old: float) -> float:
    if new == old:
        return 0.0
    return (new - old) / abs(old) if old != 0 else math.copysign(math.inf, new - old)


def _order(name: str) -> tuple[int, str]:
    names = list(METRIC)
    return (names.index(name) if name in names else len(names), name)


def on_platform(path: Path, platform: str) -> bool:
    """Whether the golden file ``path`` is of ``platform``: its key (``golden_values_<key>.json``)
    is the platform or ``<environment>_<platform>`` (``harness.golden.golden_key``)."""
    key = path.name.removeprefix("golden_values_").removesuffix(".json")
    return key == platform or key.endswith(f"_{platform}")


def diff_golden(old: Golden, new: Golden, metrics: Optional[Collection[str]] = None) -> GoldenDiff:
    """NEW against OLD, per metric (every metric either holds, or those of ``metrics``)."""
    old_names, new_names = set(old.metrics), set(new.metrics)
    if metrics is not None:
        old_names, new_names = old_names & set(metrics), new_names & set(metrics)
    out = []
    for metric in sorted(old_names & new_names, key=_order):
        a, b = old.metrics[metric], new.metrics[metric]
        common = sorted(set(a) & set(b))
        rels = {s: _rel(b[s], a[s]) for s in common}
        step = max(common, key=lambda s: abs(rels[s])) if common else 0
        window = window_rel = None
        if metric == TIME_METRIC and common:
            window = steady_window(max(common))
            ma, mb = window_median(a, window), window_median(b, window)
            window_rel = _rel(mb, ma) if ma is not None and mb is not None else None
        out.append(MetricDiff(
            metric, len(common), statistics.fmean(rels.values()) if rels else 0.0,
            rels.get(step, 0.0), step, tuple(sorted(set(a) - set(b))),
            tuple(sorted(set(b) - set(a))), window, window_rel, old.rtol(metric), new.rtol(metric)))
    known = old.environment is not None and new.environment is not None
    env = tuple(differences(old.environment, new.environment)) if known else ()  # type: ignore[arg-type]
    return GoldenDiff(old, new, tuple(out), tuple(sorted(old_names - new_names, key=_order)),
                      tuple(sorted(new_names - old_names, key=_order)), env, known)


def _pct(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    return f"{x:+.3g}" if abs(x) < 1e-3 and x != 0 else f"{x * 100:+.3f}%"


def render_diff(d: GoldenDiff) -> str:
    """A Markdown table of the differences, then the metrics, steps and environment that
    changed (for a pull request)."""
    lines = [f"golden diff: {d.old.path} -> {d.new.path}", "",
             "| metric | steps | mean rel diff | largest rel diff (step) | steady-window median | rtol old -> new |",
             "|---|---|---|---|---|---|"]
    for m in d.metrics:
        window = (f"{_pct(m.window_rel)} (steps {m.window[0]}..{m.window[1]})"
                  if m.window is not None else "-")
        rtol = (f"{m.old_rtol if m.old_rtol is not None else '-'} -> "
                f"{m.new_rtol if m.new_rtol is not None else '-'}")
        lines.append(f"| {m.metric} | {m.steps} | {_pct(m.mean_rel)} | {_pct(m.largest_rel)} "
                     f"(step {m.largest_step}) | {window} | {rtol} |")
    notes = []
    if d.only_old:
        notes.append(f"metrics only in OLD (dropped): {', '.join(d.only_old)}")
    if d.only_new:
        notes.append(f"metrics only in NEW (added): {', '.join(d.only_new)}")
    for m in d.metrics:
        if m.only_old:
            notes.append(f"{m.metric}: steps only in OLD: {collapse_runs(list(m.only_old))}")
        if m.only_new:
            notes.append(f"{m.metric}: steps only in NEW: {collapse_runs(list(m.only_new))}")
    if not d.environment_known:
        notes.append("environment: not recorded in both files (recorded by dcp-harness since "
                     "issue 24)")
    elif d.environment:
        notes.append("environment changed: " + "; ".join(d.environment))
    else:
        notes.append("environment: the same in both files")
    return "\n".join(lines + [""] + [f"- {n}" for n in notes]) + "\n"


@dataclass(frozen=True)
class FileDiff:
    """One pair of files of a review: their diff, or None when one side is missing."""

    old: Path
    new: Path
    diff: Optional[GoldenDiff]

    @property
    def missing(self) -> Path:
        """The side that is missing (a file ``diff`` is None for)."""
        return self.old if not self.old.is_file() else self.new


def file_pairs(old: Path, new: Path, platform: Optional[str]) -> list[tuple[Path, Path]]:
    """(old file, new file) to compare: the two files, or every golden file of two folders (of
    ``platform`` only, when given); ConfigError for what cannot be compared."""
    for side, path in (("OLD", old), ("NEW", new)):
        if not path.exists():
            raise ConfigError(f"golden diff: {side} {path} does not exist; give two golden files "
                              "or two folders of them")
    if old.is_dir() and new.is_dir():
        names = sorted({p.relative_to(old) for p in old.glob("*/golden_values_*.json")}
                       | {p.relative_to(new) for p in new.glob("*/golden_values_*.json")})
        if platform is not None:
            names = [n for n in names if on_platform(n, platform)]
        if not names:
            raise ConfigError(f"neither {old} nor {new} holds */golden_values_*.json files"
                              + (f" of platform '{platform}'" if platform is not None else ""))
        return [(old / n, new / n) for n in names]
    if old.is_dir() or new.is_dir():
        raise ConfigError(f"give two golden files or two folders, not a file and a folder "
                          f"({old}, {new})")
    if platform is not None:
        raise ConfigError(f"--platform {platform} chooses the files of two folders; two files "
                          "are compared as they are (drop --platform)")
    return [(old, new)]


def diff_files(old: Path, new: Path, platform: Optional[str] = None,
               metrics: Optional[Collection[str]] = None) -> Iterator[FileDiff]:
    """Each pair of :func:`file_pairs` diffed, one at a time (a review prints each as it comes);
    ConfigError naming the file for one that cannot be read."""
    for old_path, new_path in file_pairs(old, new, platform):
        if not old_path.is_file() or not new_path.is_file():
            yield FileDiff(old_path, new_path, None)
            continue
        try:
            diff = diff_golden(read_golden(old_path), read_golden(new_path), metrics)
        except GoldenError as exc:
            raise ConfigError(str(exc)) from None
        yield FileDiff(old_path, new_path, diff)
