"""Pydantic validation errors -> one located, readable :class:`Problem`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from harness.spec.fieldpaths import clean_loc, fields_at, suggest
from harness.spec.problems import Loc, Problem
from harness.spec.schema import CaseFile

_PREFIXES = ("Value error, ", "Assertion failed, ")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(error: dict[str, Any], loc: Loc, root: type[BaseModel]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1]) if loc else "?"
        allowed = fields_at(loc[:-1], root)
        hint = suggest(key, allowed)
        listing = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
        return f"unknown key '{key}'{hint}{listing}"
    if kind == "missing":
        return "required field is missing"
    msg: str = error["msg"]
    for prefix in _PREFIXES:
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        msg = "expected a mapping of fields"
        allowed = fields_at(loc, root)
        if allowed:
            msg += f" ({', '.join(allowed)})"
    if "input" in error:
        msg += f" (got {_shown(error['input'])})"
    return msg


def first_problem(
    exc: ValidationError, root: type[BaseModel] = CaseFile
) -> tuple[Problem, int]:
    """The first error as a Problem, and how many other fields have errors.

    Union alternatives that all failed at one field are reported together
    ("Input should be 'exact', or expected a mapping ..."); when one alternative got further
    (a mapping with a bad entry) its deeper error is the one reported.
    """
    errors = exc.errors()
    cleaned = [clean_loc(e["loc"], root) for e in errors]
    head_loc, head_union = cleaned[0]
    if head_union:
        related = [
            (loc, e) for (loc, _), e in zip(cleaned, errors) if loc[: len(head_loc)] == head_loc
        ]
        deepest = max(len(loc) for loc, _ in related)
        chosen = [(loc, e) for loc, e in related if len(loc) == deepest]
        loc = chosen[0][0]
        if len(chosen) == 1:
            message = _message(chosen[0][1], loc, root)
        else:
            parts: list[str] = []
            for _, e in chosen:
                text = _message({k: v for k, v in e.items() if k != "input"}, loc, root)
                if text not in parts:
                    parts.append(text)
            message = ", or ".join(parts)
            if "input" in chosen[0][1]:
                message += f" (got {_shown(chosen[0][1]['input'])})"
    else:
        loc = head_loc
        message = _message(errors[0], loc, root)
    others = {c for c, _ in cleaned if c[: len(head_loc)] != head_loc}
    return Problem(loc=loc, message=message), len(others)

