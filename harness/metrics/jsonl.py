"""JSON lines -> step records: one object per line with the fields of
``harness.results.StepRecord`` (what :class:`harness.metrics.StepRecorder` writes and the
built-in workload records). A line that is not JSON, not an object or not a step record is a
:class:`MetricsError` naming the file, the line and the field; a last line without its newline
(a write cut off by a kill) is left out, as the harness's own step store does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from harness.results import ResultsError, StepRecord, decode_nonfinite

from .errors import MetricsError


def read_jsonl(path: Path, start: int = 0, end: Optional[int] = None) -> list[StepRecord]:
    """The step records of one JSON-lines file, in file order (see the module doc); only the
    bytes from ``start`` to ``end`` (what one run of several wrote)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise MetricsError(path, f"cannot read it: {exc.strerror or exc}") from None
    first = data[:start].count(b"\n") + 1
    data = data[start:end]
    lines = data.split(b"\n")
    if lines and lines[-1] != b"":
        lines = lines[:-1]  # torn: no newline after it
    out: list[StepRecord] = []
    for lineno, raw in enumerate(lines, start=first):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise MetricsError(path, f"not JSON ({exc})", lineno) from None
        if not isinstance(obj, dict):
            raise MetricsError(path, f"a JSON {type(obj).__name__}, not an object with the "
                                     "fields of a step record", lineno)
        try:
            out.append(StepRecord.from_dict(decode_nonfinite(obj)))
        except ResultsError as exc:
            raise MetricsError(path, str(exc), lineno) from None
    return out
