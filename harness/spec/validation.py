"""Pydantic validation errors -> one located, readable :class:`Problem`."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from harness.spec.fieldpaths import clean_loc, fields_at, suggest
from harness.spec.limits import limit_reason
from harness.spec.problems import Loc, Problem
from harness.spec.schema import CaseFile

_PREFIXES = ("Value error, ", "Assertion failed, ")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(error: dict[str, Any], loc: Loc, root: type) -> str:
    kind = error["type"]
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):  # a model's / a dataclass's
        key = str(loc[-1]) if loc else "?"
        allowed = fields_at(loc[:-1], root)
        hint = suggest(key, allowed)
        listing = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
        return f"unknown key '{key}'{hint}{listing}"
    if kind == "missing":
        return "required field is missing"
    reason = limit_reason(".".join(str(part) for part in loc))
    if kind == "less_than_equal" and reason is not None:
        shown = f" (got {_shown(error['input'])})" if "input" in error else ""
        return f"must be at most {error['ctx']['le']}: {reason}{shown}"
    msg: str = error["msg"]
    for prefix in _PREFIXES:
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    if kind in ("model_type", "model_attributes_type", "dict_type", "dataclass_type"):
        msg = "expected a mapping of fields"
        allowed = fields_at(loc, root)
        if allowed:
            msg += f" ({', '.join(allowed)})"
    if "input" in error:
        msg += f" (got {_shown(error['input'])})"
    return msg


def _problem_at(head: int, errors: list[dict[str, Any]], cleaned: list[tuple[Loc, bool]],
                root: type) -> Problem:
    """The Problem of the error at index ``head`` (with its union alternatives, see below)."""
    head_loc, head_union = cleaned[head]
    if not head_union:
        return Problem(loc=head_loc, message=_message(errors[head], head_loc, root))
    related = [
        (loc, e) for (loc, _), e in zip(cleaned, errors) if loc[: len(head_loc)] == head_loc
    ]
    deepest = max(len(loc) for loc, _ in related)
    chosen = [(loc, e) for loc, e in related if len(loc) == deepest]
    loc = chosen[0][0]
    if len(chosen) == 1:
        return Problem(loc=loc, message=_message(chosen[0][1], loc, root))
    parts: list[str] = []
    for _, e in chosen:
        text = _message({k: v for k, v in e.items() if k != "input"}, loc, root)
        if text not in parts:
            parts.append(text)
    message = ", or ".join(parts)
    if "input" in chosen[0][1]:
        message += f" (got {_shown(chosen[0][1]['input'])})"
    return Problem(loc=loc, message=message)


def all_problems(exc: ValidationError, root: type = CaseFile) -> list[Problem]:
    """Every field with an error, one Problem each, in the order pydantic found them.

    Union alternatives that all failed at one field are reported together
    ("Input should be 'exact', or expected a mapping ..."); when one alternative got further
    (a mapping with a bad entry) its deeper error is the one reported.
    """
    errors = exc.errors()
    cleaned = [clean_loc(e["loc"], root) for e in errors]
    problems: list[Problem] = []
    covered: list[Loc] = []
    for index, (loc, _) in enumerate(cleaned):
        if any(loc[: len(c)] == c for c in covered):
            continue  # an alternative of a field already reported
        covered.append(loc)
        problems.append(_problem_at(index, errors, cleaned, root))
    return problems

