"""A command case's metrics source (``command.metrics``) -> each rank's step records.

``read_source(spec, arm_dir, ranks, platform)`` reads the source the case declares, its path
relative to the arm's folder (:func:`source_path`), and gives rank -> typed step records; a
MetricsError naming the file (and line) for anything it cannot read. ``source_fields(spec)`` is
what a source can fill, known when the case is planned (``harness.arms`` marks the checks of the
others not applicable).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from harness.results import StepRecord
from harness.spec.schema import METRIC_FIELDS, MetricsSource, MetricsSpec

from .errors import MetricsError
from .jsonl import read_jsonl
from .megatron_log import LOG_KEYS, read_megatron_log
from .series import StepMetrics, rank_records
from .tensorboard import TB_TAGS, event_files, read_tensorboard

# Where each source is read, relative to the arm's folder, unless ``command.metrics.path`` says.
DEFAULT_PATHS: Mapping[MetricsSource, str] = {
    MetricsSource.TENSORBOARD: "tensorboard",
    MetricsSource.MEGATRON_LOG: "log.txt",  # the ranks' output, as the launcher keeps it
    MetricsSource.JSONL: "metrics/rank{rank}.jsonl",
    MetricsSource.RECORD: "metrics/rank{rank}.jsonl",  # harness.metrics.StepRecorder's files
}
# What a step record holds beyond the series (the record API and JSON lines can carry them).
_RECORD_EXTRAS = ("graph_stats", "memory_probe", "packed", "replays", "environment")
_MEMORY_LOG_FIELDS = ("allocated_bytes", "max_allocated_bytes", "reserved_bytes")


@dataclass(frozen=True)
class SourceMark:
    """How far a source was written when a run began, for a source two runs write (the two runs
    of a resumed arm): the log's size, the event files already there, each per-rank file's
    size (file name -> bytes)."""

    log_bytes: int = 0
    event_files: frozenset[str] = frozenset()
    sizes: tuple[tuple[str, int], ...] = ()


def source_mark(spec: MetricsSpec, arm_dir: Path, path: str, ranks: Sequence[int]) -> SourceMark:
    """How far ``spec``'s source of the arm in ``arm_dir`` is written now (:class:`SourceMark`)."""
    arm_dir = Path(arm_dir)
    if spec.source is MetricsSource.TENSORBOARD:
        return SourceMark(event_files=frozenset(p.name for p in event_files(arm_dir / path)))
    if spec.source is MetricsSource.MEGATRON_LOG:
        log = arm_dir / path
        return SourceMark(log_bytes=log.stat().st_size if log.is_file() else 0)
    files = dict.fromkeys(arm_dir / path.replace("{rank}", str(r)) for r in ranks)
    return SourceMark(sizes=tuple((str(f), f.stat().st_size) for f in files if f.is_file()))


def source_path(spec: MetricsSpec) -> str:
    """The source's path as the case gives it (placeholders not yet filled)."""
    return spec.path if spec.path is not None else DEFAULT_PATHS[spec.source]


def source_fields(spec: MetricsSpec) -> frozenset[str]:
    """The step-record fields ``spec``'s source can fill."""
    if spec.source in (MetricsSource.JSONL, MetricsSource.RECORD):
        return frozenset(METRIC_FIELDS) | frozenset(_RECORD_EXTRAS)
    return frozenset(tag_map(spec)) | (frozenset(_MEMORY_LOG_FIELDS)
                                       if spec.source is MetricsSource.MEGATRON_LOG else frozenset())


def tag_map(spec: MetricsSpec) -> dict[str, str]:
    """Field -> TensorBoard tag or Megatron log key: Megatron's (``TB_TAGS``, ``LOG_KEYS``) with
    the case's ``command.metrics.tags`` over them."""
    base = TB_TAGS if spec.source is MetricsSource.TENSORBOARD else LOG_KEYS
    return {**base, **(spec.tags or {})}


def stale_files(spec: MetricsSpec, arm_dir: Path, path: str, ranks: Sequence[int]) -> list[Path]:
    """The files an earlier run of the arm left in the source (event files, rank files) that a
    new run must not be read with: the launcher removes them before it starts the command."""
    arm_dir = Path(arm_dir)
    if spec.source is MetricsSource.TENSORBOARD:
        return event_files(arm_dir / path)
    if spec.source is MetricsSource.MEGATRON_LOG:
        return []  # the launcher reads from where this run's lines begin
    files = [arm_dir / path.replace("{rank}", str(r)) for r in ranks]
    return [f for f in dict.fromkeys(files) if f.is_file()]


def _per_rank_files(path: str, arm_dir: Path, ranks: Sequence[int], platform: Optional[str],
                    since: SourceMark, until: Optional[SourceMark]) -> dict[int, list[StepRecord]]:
    """JSON lines: one file per rank (``{rank}`` in the path) or one file for every rank; the
    bytes written between ``since`` and ``until`` (a file smaller than at ``since`` was written
    afresh: all of it)."""
    out = {}
    for rank in ranks:
        file = arm_dir / path.replace("{rank}", str(rank))
        if not file.is_file():
            raise MetricsError(file, f"no metrics file for rank {rank}: the command wrote none")
        size = file.stat().st_size
        start = dict(since.sizes).get(str(file), 0)
        start = start if start <= size else 0
        end = dict(until.sizes).get(str(file), 0) if until is not None else None
        out[rank] = [r if r.platform is not None else dataclasses.replace(r, platform=platform)
                     for r in read_jsonl(file, start, end)]
    return out


def read_source(spec: MetricsSpec, arm_dir: Path, ranks: Sequence[int], platform: Optional[str],
                path: Optional[str] = None, log_start: int = 0,
                since: Optional[SourceMark] = None, until: Optional[SourceMark] = None
                ) -> dict[int, list[StepRecord]]:
    """Rank -> step records of ``ranks`` from the source of ``spec`` (``path``: the source's
    path with its placeholders filled, default :func:`source_path`; ``log_start``: where this
    run's lines begin in a Megatron log). ``since`` / ``until``: only what was written between
    these marks (:func:`source_mark`; one run of a source two runs write)."""
    arm_dir = Path(arm_dir)
    since = since if since is not None else SourceMark(log_bytes=log_start)
    where = path if path is not None else source_path(spec)
    if spec.source in (MetricsSource.JSONL, MetricsSource.RECORD):
        return _per_rank_files(where, arm_dir, ranks, platform, since, until)
    target = arm_dir / where
    metrics: StepMetrics
    if spec.source is MetricsSource.TENSORBOARD:
        metrics = read_tensorboard(target, tag_map(spec), skip=since.event_files,
                                   only=until.event_files if until is not None else None)
    else:
        if not target.is_file():
            raise MetricsError(target, "no log here: the command wrote none")
        metrics = read_megatron_log(target, tag_map(spec), start=since.log_bytes,
                                    end=until.log_bytes if until is not None else None)
    return rank_records(metrics, ranks, platform)
