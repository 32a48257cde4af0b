"""The one way a stored record is read: parsed JSON validated through pydantic as its type.

Every stored record type (step records and their environment, outcomes, phase marks, verdicts,
plans, pairs, allocation-site tables) is a dataclass or model whose unknown keys are errors and
whose fields use the strict types of ``records`` (``Int``, ``Float``, ``Str``, ``Bool``); its
reader calls :func:`read_typed`, so a renamed, mistyped or missing field is a ResultsError naming
the field, the same way for every file. A record is written through the same type
(:func:`record_json`, :func:`write_json_record`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Optional, TypeVar

from pydantic import TypeAdapter, ValidationError

from harness.spec.validation import all_problems

from .files import PathLike, ResultsError, decode_nonfinite, read_json, write_json_atomic


T = TypeVar("T")


@functools.cache
def _adapter(kind: type) -> TypeAdapter:
    return TypeAdapter(kind)


def problems_text(exc: ValidationError, kind: type) -> str:
    """``field 'a.0.b': message`` of each problem pydantic found, joined by ``; also``."""
    return "; also ".join(f"field '{p.field}': {p.message}"
                          for p in all_problems(exc, root=kind))


def read_typed(kind: type, data: Any, what: str, *, nonfinite: bool = True) -> Any:
    """``data`` (parsed JSON; ``nonfinite``: its non-finite names decoded first) validated as
    ``kind``; a ResultsError ``bad <what>: field 'x.0.y': ...`` naming each unknown, mistyped or
    missing field."""
    try:
        return _adapter(kind).validate_python(decode_nonfinite(data) if nonfinite else data)
    except ValidationError as exc:
        raise ResultsError(f"bad {what}: {problems_text(exc, kind)}") from None


def record_json(record: Any) -> Any:
    """The JSON form of a stored record, by the type :func:`read_typed` reads it with: pydantic's
    dump of that type, or the type's own ``to_dict`` where it keeps one (each says why: keys left
    out while unset, so files written before a field existed read and compare the same)."""
    to_dict = getattr(record, "to_dict", None)
    return to_dict() if to_dict is not None else _adapter(type(record)).dump_python(record)


def write_json_record(path: PathLike, record: Any) -> Path:
    """Write ``record`` (:func:`record_json`) to ``path`` atomically and return the path (read it
    back with :func:`read_json_record`)."""
    write_json_atomic(path, record_json(record))
    return Path(path)


def read_json_record(path: PathLike, kind: type[T], what: str, *,
                     nonfinite: bool = True) -> Optional[T]:
    """The record of type ``kind`` in ``path`` (:func:`read_typed`); None when there is no such
    file. A file that is not a JSON object, or not a ``kind``, raises ResultsError naming it."""
    p = Path(path)
    if not p.is_file():
        return None
    data = read_json(p)
    if not isinstance(data, dict):
        raise ResultsError(f"{p}: expected a JSON object, got a {type(data).__name__}; "
                           "delete it and re-run the case")
    try:
        return read_typed(kind, data, what, nonfinite=nonfinite)
    except ResultsError as exc:
        raise ResultsError(f"{p}: {exc}") from exc
