"""A command case's metrics source (``command.metrics``) -> each rank's step records.

``read_source(spec, arm_dir, ranks, platform)`` reads the source the case declares, its path
relative to the arm's folder (:func:`source_path`), and gives rank -> typed step records; a
MetricsError naming the file (and line) for anything it cannot read. ``source_fields(spec)`` is
what a source can fill, known when the case is planned (``harness.arms`` marks the checks of the
others not applicable).
"""

from __future__ import annotations

import dataclasses
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


def _per_rank_files(path: str, arm_dir: Path, ranks: Sequence[int],
                    platform: Optional[str]) -> dict[int, list[StepRecord]]:
    """JSON lines: one file per rank (``{rank}`` in the path) or one file for every rank."""
    out = {}
    for rank in ranks:
        file = arm_dir / path.replace("{rank}", str(rank))
        if not file.is_file():
            raise MetricsError(file, f"no metrics file for rank {rank}: the command wrote none")
        out[rank] = [r if r.platform is not None else dataclasses.replace(r, platform=platform)
                     for r in read_jsonl(file)]
    return out


def read_source(spec: MetricsSpec, arm_dir: Path, ranks: Sequence[int], platform: Optional[str],
                path: Optional[str] = None, log_start: int = 0) -> dict[int, list[StepRecord]]:
    """Rank -> step records of ``ranks`` from the source of ``spec`` (``path``: the source's
    path with its placeholders filled, default :func:`source_path`; ``log_start``: where this
    run's lines begin in a Megatron log)."""
    arm_dir = Path(arm_dir)
    where = path if path is not None else source_path(spec)
    if spec.source in (MetricsSource.JSONL, MetricsSource.RECORD):
        return _per_rank_files(where, arm_dir, ranks, platform)
    target = arm_dir / where
    metrics: StepMetrics
    if spec.source is MetricsSource.TENSORBOARD:
        metrics = read_tensorboard(target, tag_map(spec))
    else:
        if not target.is_file():
            raise MetricsError(target, "no log here: the command wrote none")
        metrics = read_megatron_log(target, tag_map(spec), start=log_start)
    return rank_records(metrics, ranks, platform)
