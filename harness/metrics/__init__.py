"""Metrics in, step records out: a training command's metrics (TensorBoard event files, Megatron
log lines, JSON lines) read into the harness's typed step records (``harness.results.StepRecord``),
and the record API a training loop writes them with (:class:`StepRecorder`).

Modules, one job each: ``errors`` (:class:`MetricsError`, naming file and line), ``series``
(:class:`StepMetrics`, a reader's values per step, and how they become step records),
``tensorboard`` (``read_tensorboard``, TensorBoard's own ``EventAccumulator``; Megatron's tags,
:data:`TB_TAGS`), ``megatron_log`` (``read_megatron_log``; :data:`LOG_KEYS`), ``jsonl``
(``read_jsonl``), ``sources`` (one reader object per source, :class:`SourceReader`: its
fields, tag map, stale files, reading, ``mark`` and ``read_between``; its facts are
``harness.spec.source_facts``; ``reader_of``, ``read_source``), ``recorder`` (:class:`StepRecorder`, ``cuda_memory``,
``memory_probe``, ``pool_bytes``). No module imports torch or tensorboard when imported.
"""

from __future__ import annotations

from .errors import MetricsError
from .jsonl import read_jsonl
from .megatron_log import LOG_KEYS, read_megatron_log
from .recorder import (METRICS_DIR_ENV, GraphStats, MemoryProbe, StepRecorder, cuda_memory,
                       memory_probe, pool_bytes)
from .series import StepMetrics, rank_records, step_record
from .sources import (DEFAULT_PATHS, READERS, JsonLinesReader, MegatronLogReader, SourceMark,
                      SourceReader, TensorBoardReader, read_between, read_source, reader_of,
                      source_fields, source_mark, source_path, stale_files)
from .tensorboard import TB_TAGS, event_files, read_tensorboard, reader_missing

__all__ = [
    "DEFAULT_PATHS", "JsonLinesReader", "LOG_KEYS", "MegatronLogReader", "READERS",
    "SourceReader", "TensorBoardReader", "METRICS_DIR_ENV", "TB_TAGS", "GraphStats", "MemoryProbe",
    "MetricsError", "StepMetrics", "StepRecorder", "cuda_memory", "event_files", "memory_probe",
    "pool_bytes", "rank_records", "read_jsonl", "read_megatron_log", "read_source", "reader_of",
    "read_tensorboard", "source_fields", "source_path", "stale_files", "step_record",
    "SourceMark", "source_mark", "reader_missing", "read_between",
]
