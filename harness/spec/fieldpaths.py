"""Walking the case schema by field path: which paths exist, and clean paths for pydantic errors.

A section is a pydantic model or a dataclass that pydantic validates (the step records of
``harness.results``), so both are walked the same way.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from typing import Any, Literal, Mapping, Optional, Sequence, Union, get_args, get_origin

from pydantic import BaseModel

from harness.spec.problems import Loc
from harness.spec.schema import CaseFile


def _members(annotation: Any) -> tuple[Any, ...]:
    """The non-None alternatives of an Optional/Union annotation (the annotation itself if plain)."""
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(a for a in get_args(annotation) if a is not type(None))
    return (annotation,)


def _is_section(m: Any) -> bool:
    return isinstance(m, type) and (issubclass(m, BaseModel) or dataclasses.is_dataclass(m))


def _models(annotation: Any) -> tuple[type, ...]:
    return tuple(m for m in _members(annotation) if _is_section(m))


@functools.lru_cache(maxsize=None)
def _field_types(section: type) -> Mapping[str, Any]:
    """Field name -> annotation of a model or dataclass, in declaration order."""
    if issubclass(section, BaseModel):
        return {name: f.annotation for name, f in section.model_fields.items()}
    hints = typing.get_type_hints(section)
    return {f.name: hints[f.name] for f in dataclasses.fields(section)}


def _owner(models: Sequence[type], part: Union[str, int]) -> Optional[type]:
    """The section among ``models`` that has a field ``part``."""
    return next((m for m in models if isinstance(part, str) and part in _field_types(m)), None)


def field_names(annotation: Any) -> list[str]:
    """Field names of the model(s) an annotation may hold, in declaration order."""
    names: list[str] = []
    for model in _models(annotation):
        names.extend(n for n in _field_types(model) if n not in names)
    return names


def suggest(name: str, candidates: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` when one candidate is close to ``name``, else ''."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def resolve_dotted(path: str, root: type = CaseFile) -> Optional[str]:
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
        owner = _owner(_models(annotation), part)
        assert owner is not None
        annotation = _field_types(owner)[part]
        walked.append(part)
    return None


def _tag_matches(member: Any, tag: str) -> bool:
    if isinstance(member, type):
        # plain models are tagged by name; models with validators as "function-after[..., Name]"
        return tag == member.__name__ or tag.endswith(f", {member.__name__}]")
    if get_origin(member) is Literal:
        return tag.startswith("literal[")
    return str(member) == tag


def clean_loc(loc: Sequence[Union[str, int]], root: type = CaseFile) -> tuple[Loc, bool]:
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
        owner = _owner(models, part)
        if owner is not None:
            kept.append(part)
            annotation = _field_types(owner)[part]
            continue
        if len(members) > 1 and isinstance(part, str):
            match = next((m for m in members if _tag_matches(m, part)), None)
            if match is not None:
                dropped = True
                annotation = match
                continue
        kept.append(part)
        annotation = _item(annotation, part)
    return tuple(kept), dropped


def _item(annotation: Any, part: Union[str, int]) -> Any:
    """The annotation of entry ``part`` of a list or tuple (an index) or a dict, else None."""
    members = _members(annotation)
    if len(members) != 1:
        return None
    origin, args = get_origin(members[0]), get_args(members[0])
    if origin in (list, tuple) and isinstance(part, int) and args:
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    return None


def fields_at(loc: Loc, root: type = CaseFile) -> list[str]:
    """Field names of the section at ``loc`` (empty if ``loc`` is not a section)."""
    annotation: Any = root
    for part in loc:
        owner = _owner(_models(annotation), part)
        annotation = _field_types(owner)[part] if owner is not None else _item(annotation, part)
        if annotation is None:
            return []
    return field_names(annotation)
