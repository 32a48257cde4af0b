"""A command case's metrics source (``command.metrics``) -> each rank's step records: one reader
object per source.

A :class:`SourceReader` holds all a source is: the fields it can fill (known when the case is
planned: ``harness.arms`` marks the checks of the others not applicable), its tag map, its
default path (relative to the arm's folder), the files an earlier run left in it, and reading it
(rank -> typed step records; a MetricsError naming the file, and line, for anything it cannot
read). :class:`TensorBoardReader`, :class:`MegatronLogReader` and :class:`JsonLinesReader` (JSON
lines, and the record API's files) are the readers, each marking how far a run wrote its source
(:meth:`SourceReader.mark`) and reading what one run wrote (:meth:`SourceReader.read_between`:
the two runs of a resumed arm); :func:`reader_of` picks the one of a case. What a source is
(one writer, memory, checkpoint step, ...) is data beside ``MetricsSource``
(``harness.spec.source_facts``): nothing outside ``harness.metrics`` asks which source a case has.
"""

from __future__ import annotations

import abc
import dataclasses
from pathlib import Path
from typing import ClassVar, Mapping, Optional, Sequence

from harness.results import StepRecord
from harness.spec.schema import METRIC_FIELDS, MetricsSource, MetricsSpec
from harness.spec.source_facts import SOURCE_FACTS, SourceFacts, source_facts

from .errors import MetricsError
from .jsonl import read_jsonl
from .megatron_log import LOG_KEYS, read_megatron_log
from .series import rank_records
from .tensorboard import TB_TAGS, event_files, read_tensorboard

# What a step record holds beyond the series (the record API and JSON lines can carry them).
_RECORD_EXTRAS = ("graph_stats", "memory_probe", "packed", "replays", "environment")
_MEMORY_LOG_FIELDS = ("allocated_bytes", "max_allocated_bytes", "reserved_bytes")


@dataclasses.dataclass(frozen=True)
class SourceMark:
    """How far a source was written when a run began, for a source two runs write (the two runs
    of a resumed arm): the log's size, the event files already there, each per-rank file's
    size (file name -> bytes)."""

    log_bytes: int = 0
    event_files: frozenset[str] = frozenset()
    sizes: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class SourceReader(abc.ABC):
    """The reader of one case's metrics source (``spec``); a subclass per source (abstract:
    each source says how it reads and marks). Its static facts (``harness.spec.source_facts``)
    are :attr:`facts`."""

    spec: MetricsSpec
    base_tags: ClassVar[Mapping[str, str]] = {}  # field -> the source's own name for it

    @property
    def facts(self) -> SourceFacts:
        """The source's static facts (one writer, memory, checkpoint step, ...)."""
        return source_facts(self.spec)

    @property
    def path(self) -> str:
        """The source's path as the case gives it (placeholders not yet filled)."""
        return self.spec.path if self.spec.path is not None else self.facts.default_path

    def tag_map(self) -> dict[str, str]:
        """Field -> the source's tag or key: the source's defaults with the case's
        ``command.metrics.tags`` over them."""
        return {**self.base_tags, **(self.spec.tags or {})}

    def fields(self) -> frozenset[str]:
        """The step-record fields this source can fill."""
        return frozenset(self.tag_map())

    def stale_files(self, arm_dir: Path, path: str, ranks: Sequence[int]) -> list[Path]:
        """Files an earlier run of the arm left in the source that a new run must not be read
        with (the launcher removes them before it starts the command)."""
        return []

    @abc.abstractmethod
    def read(self, arm_dir: Path, ranks: Sequence[int], platform: Optional[str], path: str,
             start: int = 0) -> dict[int, list[StepRecord]]:
        """Rank -> step records of ``ranks`` (``path``: the source's path, placeholders filled;
        ``start``: where this run's lines begin in the arm's log, for a source read from it)."""

    @abc.abstractmethod
    def mark(self, arm_dir: Path, path: str, ranks: Sequence[int]) -> SourceMark:
        """How far the source of the arm in ``arm_dir`` is written now (:class:`SourceMark`)."""

    @abc.abstractmethod
    def read_between(self, arm_dir: Path, ranks: Sequence[int], platform: Optional[str],
                     path: str, since: SourceMark, until: Optional[SourceMark] = None
                     ) -> dict[int, list[StepRecord]]:
        """Rank -> step records of what one run wrote to the source, between the marks
        ``since`` and ``until`` (None: to the end)."""


def _last(ranks: Sequence[int]) -> Optional[int]:
    """The rank that writes Megatron's TensorBoard files: the last."""
    return max(ranks) if ranks else None


class TensorBoardReader(SourceReader):
    """TensorBoard event files in a folder (``tensorboard``), Megatron's tags (``TB_TAGS``),
    written by the last rank (its memory is its own); an earlier run's event files are stale,
    a run's files are those it added."""

    base_tags = TB_TAGS

    def stale_files(self, arm_dir: Path, path: str, ranks: Sequence[int]) -> list[Path]:
        return event_files(Path(arm_dir) / path)

    def read(self, arm_dir: Path, ranks: Sequence[int], platform: Optional[str], path: str,
             start: int = 0) -> dict[int, list[StepRecord]]:
        return rank_records(read_tensorboard(Path(arm_dir) / path, self.tag_map(),
                                             writer_rank=_last(ranks)), ranks, platform)

    def mark(self, arm_dir: Path, path: str, ranks: Sequence[int]) -> SourceMark:
        return SourceMark(event_files=frozenset(p.name for p in event_files(Path(arm_dir) / path)))

    def read_between(self, arm_dir: Path, ranks: Sequence[int], platform: Optional[str],
                     path: str, since: SourceMark, until: Optional[SourceMark] = None
                     ) -> dict[int, list[StepRecord]]:
        metrics = read_tensorboard(Path(arm_dir) / path, self.tag_map(), skip=since.event_files,
                                   only=until.event_files if until is not None else None,
                                   writer_rank=_last(ranks))
        return rank_records(metrics, ranks, platform)


class MegatronLogReader(SourceReader):
    """Megatron's log lines in the ranks' output as the launcher keeps it (``log.txt``), its keys
    (``LOG_KEYS``) and its memory report; read from where this run's lines begin, so nothing is
    stale; a run's lines are the bytes it added."""

    base_tags = LOG_KEYS

    def fields(self) -> frozenset[str]:
        return super().fields() | frozenset(_MEMORY_LOG_FIELDS)

    def _log(self, arm_dir: Path, path: str) -> Path:
        target = Path(arm_dir) / path
        if not target.is_file():
            raise MetricsError(target, "no log here: the command wrote none")
        return target

    def read(self, arm_dir: Path, ranks: Sequence[int], platform: Optional[str], path: str,
             start: int = 0) -> dict[int, list[StepRecord]]:
        return rank_records(read_megatron_log(self._log(arm_dir, path), self.tag_map(),
                                              start=start), ranks, platform)

    def mark(self, arm_dir: Path, path: str, ranks: Sequence[int]) -> SourceMark:
        log = Path(arm_dir) / path
        return SourceMark(log_bytes=log.stat().st_size if log.is_file() else 0)

    def read_between(self, arm_dir: Path, ranks: Sequence[int], platform: Optional[str],
                     path: str, since: SourceMark, until: Optional[SourceMark] = None
                     ) -> dict[int, list[StepRecord]]:
        metrics = read_megatron_log(self._log(arm_dir, path), self.tag_map(),
                                    start=since.log_bytes,
                                    end=until.log_bytes if until is not None else None)
        return rank_records(metrics, ranks, platform)


class JsonLinesReader(SourceReader):
    """Step records as JSON lines, one file per rank (``{rank}`` in the path) or one for every
    rank: a command's own (``jsonl``) or the record API's (``record``: ``StepRecorder``); every
    field of a step record; the files an earlier run wrote are stale; a run's records are the
    bytes it added to each file (a file smaller than at the mark was written afresh: all of it)."""

    def fields(self) -> frozenset[str]:
        return frozenset(METRIC_FIELDS) | frozenset(_RECORD_EXTRAS)

    def _files(self, arm_dir: Path, path: str, ranks: Sequence[int]) -> dict[int, Path]:
        return {r: Path(arm_dir) / path.replace("{rank}", str(r)) for r in ranks}

    def stale_files(self, arm_dir: Path, path: str, ranks: Sequence[int]) -> list[Path]:
        files = self._files(arm_dir, path, ranks).values()
        return [f for f in dict.fromkeys(files) if f.is_file()]

    def read(self, arm_dir: Path, ranks: Sequence[int], platform: Optional[str], path: str,
             start: int = 0) -> dict[int, list[StepRecord]]:
        return self.read_between(arm_dir, ranks, platform, path, SourceMark())

    def mark(self, arm_dir: Path, path: str, ranks: Sequence[int]) -> SourceMark:
        files = dict.fromkeys(self._files(arm_dir, path, ranks).values())
        return SourceMark(sizes=tuple((str(f), f.stat().st_size) for f in files if f.is_file()))

    def read_between(self, arm_dir: Path, ranks: Sequence[int], platform: Optional[str],
                     path: str, since: SourceMark, until: Optional[SourceMark] = None
                     ) -> dict[int, list[StepRecord]]:
        out = {}
        for rank, file in self._files(arm_dir, path, ranks).items():
            if not file.is_file():
                raise MetricsError(file, f"no metrics file for rank {rank}: the command wrote none")
            size = file.stat().st_size
            start = dict(since.sizes).get(str(file), 0)
            start = start if start <= size else 0
            end = dict(until.sizes).get(str(file), 0) if until is not None else None
            out[rank] = [r if r.platform is not None else dataclasses.replace(r, platform=platform)
                         for r in read_jsonl(file, start, end)]
        return out


READERS: Mapping[MetricsSource, type[SourceReader]] = {
    MetricsSource.TENSORBOARD: TensorBoardReader,
    MetricsSource.MEGATRON_LOG: MegatronLogReader,
    MetricsSource.JSONL: JsonLinesReader,
    MetricsSource.RECORD: JsonLinesReader,  # harness.metrics.StepRecorder's files
}
DEFAULT_PATHS: Mapping[MetricsSource, str] = {s: f.default_path for s, f in SOURCE_FACTS.items()}


def reader_of(spec: MetricsSpec) -> SourceReader:
    """The reader of ``spec``'s source."""
    return READERS[spec.source](spec)


def source_path(spec: MetricsSpec) -> str:
    """The source's path as the case gives it (placeholders not yet filled)."""
    return reader_of(spec).path


def source_fields(spec: MetricsSpec) -> frozenset[str]:
    """The step-record fields ``spec``'s source can fill."""
    return reader_of(spec).fields()


def stale_files(spec: MetricsSpec, arm_dir: Path, path: str, ranks: Sequence[int]) -> list[Path]:
    """What an earlier run of the arm left in ``spec``'s source (:meth:`SourceReader.stale_files`)."""
    return reader_of(spec).stale_files(arm_dir, path, ranks)


def read_source(spec: MetricsSpec, arm_dir: Path, ranks: Sequence[int], platform: Optional[str],
                path: Optional[str] = None, log_start: int = 0) -> dict[int, list[StepRecord]]:
    """Rank -> step records of ``ranks`` from the source of ``spec`` (``path``: the source's
    path with its placeholders filled, default :func:`source_path`; ``log_start``: where this
    run's lines begin in the arm's log)."""
    reader = reader_of(spec)
    return reader.read(arm_dir, ranks, platform, reader.path if path is None else path, log_start)


def source_mark(spec: MetricsSpec, arm_dir: Path, path: str, ranks: Sequence[int]) -> SourceMark:
    """:meth:`SourceReader.mark` of ``spec``'s reader."""
    return reader_of(spec).mark(Path(arm_dir), path, ranks)


def read_between(spec: MetricsSpec, arm_dir: Path, ranks: Sequence[int], platform: Optional[str],
                 path: str, since: SourceMark, until: Optional[SourceMark] = None
                 ) -> dict[int, list[StepRecord]]:
    """:meth:`SourceReader.read_between` of ``spec``'s reader."""
    return reader_of(spec).read_between(Path(arm_dir), ranks, platform, path, since, until)
