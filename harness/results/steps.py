"""The step store: one rank's step records, appended durably to ``<arm>/rank<k>.jsonl`` and read
back typed (a line torn by a kill is cut off; any other bad line is an error naming file:line and,
for a line that is JSON but not a step record, the field)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator, Optional

from pydantic import TypeAdapter, ValidationError

from .files import PathLike, ResultsError, decode_nonfinite, encode_nonfinite, fsync_dir
from .paths import rank_file, rank_files
from .records import StepRecord
from .typed import record_json


_NONFINITE_NAME = re.compile(rb"NaN|Infinity|\\u")


def _may_name_nonfinite(raw: bytes) -> bool:
    """Whether a line may hold a non-finite name (``"NaN"``, ``"Infinity"``, or any string written
    with ``\\u`` escapes): one without is parsed as it is, the walk through it skipped."""
    return _NONFINITE_NAME.search(raw) is not None


def _parse_lines(path: Path, data: bytes) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """Parse complete lines of a JSONL file. Returns ((line number, JSON object) of each record,
    byte length of the good prefix); non-finite names are decoded to floats.

    The last line is torn when it lacks its newline or does not parse; it is left out. Any
    other bad line is corruption and raises ResultsError.
    """
    records: list[tuple[int, dict[str, Any]]] = []
    good = 0
    pos = 0
    lineno = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        end = len(data) if nl < 0 else nl
        raw = data[pos:end]
        lineno += 1
        is_last = nl < 0 or nl == len(data) - 1
        if nl < 0:  # no newline: the write was interrupted
            break
        if raw.strip():
            try:
                rec = json.loads(raw.decode("utf-8"))
                if not isinstance(rec, dict):
                    raise ValueError(f"a {type(rec).__name__}, not an object")
            except (ValueError, UnicodeDecodeError) as exc:
                if is_last:
                    break
                raise ResultsError(
                    f"{path}:{lineno}: corrupt step record ({exc}); the file was edited or two "
                    f"writers shared it. Delete the arm folder {path.parent} and re-run."
                ) from exc
            records.append((lineno, decode_nonfinite(rec) if _may_name_nonfinite(raw) else rec))
        pos = end + 1
        good = pos
    return records, good


def _typed(path: Path, lines: list[tuple[int, dict[str, Any]]]) -> list[StepRecord]:
    out = []
    for lineno, raw in lines:
        try:
            out.append(StepRecord.from_dict(raw))
        except ResultsError as exc:
            raise ResultsError(f"{path}:{lineno}: {exc}. Delete the arm folder {path.parent} "
                               "and re-run") from None
    return out


_RECORD = TypeAdapter(StepRecord)


def _whole_lines(data: bytes) -> Optional[list[StepRecord]]:
    """The records of a rank file whose every line is whole and a valid record naming no
    non-finite value, each line parsed and validated by pydantic from its bytes at once (the
    same rules as ``StepRecord.from_dict`` of ``json.loads``, in half the time); None for any
    other file (a torn or bad line, a non-finite name): the line-by-line reading says what."""
    if data and not data.endswith(b"\n") or _may_name_nonfinite(data):
        return None
    try:
        return [_RECORD.validate_json(raw) for raw in data.split(b"\n") if raw.strip()]
    except ValidationError:
        return None


def read_rank_file(path: PathLike) -> list[StepRecord]:
    """The typed records of one rank file (a torn last line ignored); ResultsError naming
    file:line (and the field) for a line that is not a valid step record."""
    p = Path(path)
    data = p.read_bytes()
    whole = _whole_lines(data)
    return whole if whole is not None else _typed(p, _parse_lines(p, data)[0])


def parse_step_line(raw: bytes) -> Optional[StepRecord]:
    """One line of a rank file as a record, or None when it is not one (a reader following a
    file while it is written: ``launch.local.progress``)."""
    try:
        data = json.loads(raw.decode("utf-8"))
        return StepRecord.from_dict(decode_nonfinite(data)) if isinstance(data, dict) else None
    except (ValueError, ResultsError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


@contextlib.contextmanager
def reading_many() -> Iterator[None]:
    """Python's cycle collector paused while many records are read and used (a sweep's): they
    hold no cycles, and each collection walks every object read so far (at 640,000 records a
    third of the time of reading them). It runs as before afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def read_steps(arm_dir_: PathLike) -> dict[int, list[StepRecord]]:
    """Rank -> typed step records of one arm (a torn last line ignored). Missing folder -> {}."""
    return {rank: read_rank_file(path) for rank, path in rank_files(arm_dir_).items()}


class StepWriter:
    """Appends one rank's step records to ``<arm_dir>/rank<k>.jsonl``, durably per step.

    Each record must hold an integer ``step`` (1-based). Every append is flushed and fsynced,
    so a killed run loses at most the step in flight. On open, a torn last line (left by a kill
    mid-write) is cut off. With ``resume=True`` (default) existing records are kept and a record
    whose step is not after the last recorded step is dropped (``append`` returns False), so a
    resumed arm never duplicates steps; ``resume=False`` starts the file afresh.
    """

    def __init__(self, arm_dir: PathLike, rank: int, *, resume: bool = True) -> None:
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        self.path = rank_file(arm_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._last_step = 0
        if resume and self.path.exists():
            data = self.path.read_bytes()
            lines, good = _parse_lines(self.path, data)
            if good != len(data):
                with open(self.path, "r+b") as fh:
                    fh.truncate(good)
                    fh.flush()
                    os.fsync(fh.fileno())
            self._last_step = max((r.step for r in _typed(self.path, lines)), default=0)
        else:
            with open(self.path, "wb") as fh:
                fh.flush()
                os.fsync(fh.fileno())
            fsync_dir(self.path.parent)

    def completed_steps(self) -> int:
        """Number of the last durably recorded step (0 when none): resume after it."""
        return self._last_step

    def append(self, record: StepRecord) -> bool:
        """Write one step record durably. Returns False (and writes nothing) for a step that is
        already recorded. What is written is read back by the reader's own validation first, so
        a record the reader would refuse is a ValueError naming the field, never a line."""
        if not isinstance(record, StepRecord):
            raise TypeError(f"{self.path}: StepWriter.append takes a StepRecord, got "
                            f"{type(record).__name__}")
        step = record.step
        if step <= self._last_step:
            return False
        data = record_json(record)
        try:
            StepRecord.from_dict(data)
        except ResultsError as exc:
            raise ValueError(f"{self.path}: step {step}: {exc}") from None
        line = json.dumps(encode_nonfinite(data), allow_nan=False, ensure_ascii=False)
        with open(self.path, "ab") as fh:
            fh.write(line.encode("utf-8") + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        self._last_step = step
        return True
