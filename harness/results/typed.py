"""The one way a stored record is read: parsed JSON validated through pydantic as its type.

Every stored record type (step records and their environment, outcomes, phase marks, verdicts,
plans, pairs, allocation-site tables) is a dataclass or model whose unknown keys are errors and
whose fields use the strict types of ``records`` (``Int``, ``Float``, ``Str``, ``Bool``); its
reader calls :func:`read_typed`, so a renamed, mistyped or missing field is a ResultsError naming
the field, the same way for every file.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import TypeAdapter, ValidationError

from harness.spec.validation import all_problems

from .files import ResultsError, decode_nonfinite


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
