"""The one way a stored record is read: parsed JSON validated through pydantic as its type.

Every stored record type (step records and their environment, outcomes, phase marks, verdicts,
plans, pairs, allocation-site tables) is a dataclass or model whose unknown keys are errors and
whose fields use the strict types of ``records`` (``Int``, ``Float``, ``Str``, ``Bool``); its
reader calls :func:`read_typed`, so a renamed, mistyped or missing field is a ResultsError naming
the field, the same way for every file. A record is written through the same type
(:func:`record_json`, :func:`write_json_record`): pydantic's dump of it is the file, with
:data:`OmitNone` / :data:`OmitEmpty` on a field left out while unset (one added after files
were written without it, so files before and after read and compare the same) and
:func:`keys_in_order` where the file's order of keys is not the order of the fields.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from pydantic import Field, TypeAdapter, ValidationError, model_serializer

from harness.spec.validation import all_problems

from .files import PathLike, ResultsError, decode_nonfinite, read_json, write_json_atomic


T = TypeVar("T")


# A field written only while set (``Annotated[Optional[Int], OmitNone]``): None, or (OmitEmpty)
# None, False or empty, is left out of the file.
OmitNone = Field(exclude_if=lambda value: value is None)
OmitEmpty = Field(exclude_if=lambda value: value is None or value is False or
                  (isinstance(value, (tuple, list, dict)) and not value))


def keys_in_order(*keys: str) -> Any:
    """A record's serializer (``_keys = keys_in_order("a", "b")`` in its class) that writes its
    keys in this order, the file's, where that is not the order of its fields (which positional
    construction fixes); every field must be named."""

    def ordered(self: Any, dump: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        out = dump(self)
        if not set(out) <= set(keys):
            raise ValueError(f"{type(self).__name__}: keys_in_order does not name "
                             f"{sorted(set(out) - set(keys))}")
        return {k: out[k] for k in keys if k in out}

    return model_serializer(mode="wrap")(ordered)


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
    dump of that type. Python mode, no warnings: a value is written as the record holds it (an
    int in a float field as an int, a non-finite float for :func:`~harness.results.files.dumps`
    to name); a value of the wrong type is for the reader to refuse (``StepWriter`` reads each
    record back before it writes it); arrays as lists, as the file reads back."""
    return _lists(_adapter(type(record)).dump_python(record, warnings=False))


def _lists(obj: Any) -> Any:
    if isinstance(obj, (tuple, list)):
        return [_lists(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _lists(v) for k, v in obj.items()}
    return obj


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
