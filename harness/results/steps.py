"""The step store: one rank's step records, appended durably to ``<arm>/rank<k>.jsonl`` and read
back typed (a line torn by a kill is cut off; any other bad line is an error naming file:line)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Union

from .files import PathLike, ResultsError, decode_nonfinite, encode_nonfinite, fsync_dir
from .paths import rank_file, rank_files
from .records import StepRecord


def _parse_lines(path: Path, data: bytes) -> tuple[list[dict], int]:
    """Parse complete lines of a JSONL file. Returns (records, byte length of the good prefix).

    The last line is torn when it lacks its newline or does not parse; it is left out. Any
    other bad line is corruption and raises ResultsError.
    """
    records: list[dict] = []
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
            records.append(decode_nonfinite(rec))
        pos = end + 1
        good = pos
    return records, good


def read_rank_file(path: PathLike) -> list[StepRecord]:
    """The typed records of one rank file (a torn last line ignored); ResultsError naming
    file:line for a line that is not a valid step record."""
    p = Path(path)
    out = []
    for lineno, raw in enumerate(_parse_lines(p, p.read_bytes())[0], start=1):
        try:
            out.append(StepRecord.from_dict(raw))
        except ResultsError as exc:
            raise ResultsError(f"{p}: record {lineno}: {exc}. Delete the arm folder {p.parent} "
                               "and re-run") from None
    return out


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
            records, good = _parse_lines(self.path, data)
            if good != len(data):
                with open(self.path, "r+b") as fh:
                    fh.truncate(good)
                    fh.flush()
                    os.fsync(fh.fileno())
            self._last_step = max((_step_of(r, self.path) for r in records), default=0)
        else:
            with open(self.path, "wb") as fh:
                fh.flush()
                os.fsync(fh.fileno())
            fsync_dir(self.path.parent)

    def completed_steps(self) -> int:
        """Number of the last durably recorded step (0 when none): resume after it."""
        return self._last_step

    def append(self, record: Union[StepRecord, Mapping[str, Any]]) -> bool:
        """Write one step record durably. Returns False (and writes nothing) for a step that is
        already recorded; raises ValueError for a record without a valid ``step`` (a mapping is
        read through :meth:`StepRecord.from_dict`, so what is written can be read back)."""
        if not isinstance(record, StepRecord):
            _step_of(record, self.path)
            try:
                record = StepRecord.from_dict(record)
            except ResultsError as exc:
                raise ValueError(f"{self.path}: {exc}") from None
        step = record.step
        if step <= self._last_step:
            return False
        line = json.dumps(encode_nonfinite(record.to_dict()), allow_nan=False, ensure_ascii=False)
        with open(self.path, "ab") as fh:
            fh.write(line.encode("utf-8") + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        self._last_step = step
        return True


def _step_of(record: Mapping[str, Any], where: Path) -> int:
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"{where}: a step record needs an integer 'step' >= 1, got {step!r}")
    return step


