"""Walking the case schema by field path: which paths exist, and clean paths for pydantic errors."""

from __future__ import annotations

import difflib
import types
from typing import Any, Literal, Optional, Sequence, Union, get_args, get_origin

from pydantic import BaseModel

from harness.spec.problems import Loc
from harness.spec.schema import CaseFile


def _members(annotation: Any) -> tuple[Any, ...]:
    """The non-None alternatives of an Optional/Union annotation (the annotation itself if plain)."""
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(a for a in get_args(annotation) if a is not type(None))
    return (annotation,)


def _models(annotation: Any) -> tuple[type[BaseModel], ...]:
    return tuple(
        m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)
    )


def field_names(annotation: Any) -> list[str]:
    """Field names of the model(s) an annotation may hold, in declaration order."""
    names: list[str] = []
    for model in _models(annotation):
        names.extend(n for n in model.model_fields if n not in names)
    return names


def suggest(name: str, candidates: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` when one candidate is close to ``name``, else ''."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def resolve_dotted(path: str, root: type[BaseModel] = CaseFile) -> Optional[str]:
    """None if ``path`` (``a.b.c``) names a field of the schema, else why it does not."""
    annotation: Any = root
    walked: list[str] = []
    for part in path.split("."):
        names = field_names(annotation)
        if not names:
            where = ".".join(walked)
            return f"'{where}' is a value, not a section with fields"
        if part not in names:
            where = f"'{'.'.join(walked)}'" if walked else "a case file"
            return (
                f"{where} has no field '{part}'{suggest(part, names)}; "
                f"fields: {', '.join(names)}"
            )
        annotation = next(m for m in _models(annotation) if part in m.model_fields)
        annotation = annotation.model_fields[part].annotation
        walked.append(part)
    return None


def _tag_matches(member: Any, tag: str) -> bool:
    if isinstance(member, type):
        # plain models are tagged by name; models with validators as "function-after[..., Name]"
        return tag == member.__name__ or tag.endswith(f", {member.__name__}]")
    if get_origin(member) is Literal:
        return tag.startswith("literal[")
    return str(member) == tag


def clean_loc(loc: Sequence[Union[str, int]], root: type[BaseModel] = CaseFile) -> tuple[Loc, bool]:
    """A pydantic error location without union-member tags, and whether a tag was dropped.

    Pydantic puts the name of the union member it tried into the location
    (``compare.repeat.loss.Tolerance.max_abs``); users only know the field path.
    """
    annotation: Any = root
    kept: list[Union[str, int]] = []
    dropped = False
    for part in loc:
        members = _members(annotation) if annotation is not None else ()
        models = _models(annotation) if annotation is not None else ()
        owner = next((m for m in models if isinstance(part, str) and part in m.model_fields), None)
        if owner is not None:
            kept.append(part)
            annotation = owner.model_fields[part].annotation
            continue
        if len(members) > 1 and isinstance(part, str):
            match = next((m for m in members if _tag_matches(m, part)), None)
            if match is not None:
                dropped = True
                annotation = match
                continue
        kept.append(part)
        origin = get_origin(members[0]) if len(members) == 1 else None
        args = get_args(members[0]) if len(members) == 1 else ()
        if origin in (list, tuple) and isinstance(part, int) and args:
            annotation = args[0]
        elif origin is dict and len(args) == 2:
            annotation = args[1]
        else:
            annotation = None
    return tuple(kept), dropped


def fields_at(loc: Loc, root: type[BaseModel] = CaseFile) -> list[str]:
    """Field names of the section at ``loc`` (empty if ``loc`` is not a section)."""
    annotation: Any = root
    for part in loc:
        models = _models(annotation)
        owner = next((m for m in models if isinstance(part, str) and part in m.model_fields), None)
        if owner is None:
            return []
        annotation = owner.model_fields[part].annotation
    return field_names(annotation)
