"""The ``compare:`` section's parts: one per registered comparison, its settings and its rules.

A comparison is one module of ``harness.compare.contracts`` (a floor above this one); it
registers itself there (``harness.compare.registry.register``), which adds its part of the case
schema here: the settings model of ``compare.<name>`` and the preflight rules of those settings
(``harness.spec.preflight`` runs them). ``harness`` imports ``harness.compare`` when it is
imported, so every comparison has registered its section before any case is read.

Adding a section rebuilds :class:`~harness.spec.schema.CompareSpec` in place (the class every
annotation names stays the same object): its fields are the sections in ``order``, then
``sanity``; the case models that hold it are rebuilt with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from harness.spec.problems import Problem
from harness.spec.schema import BaseCase, Case, CaseFile, CompareSpec

# A section's preflight rules: the case (a user's case, or a command case: the rules say which
# apply to it) and its settings -> the problems found.
Rules = Callable[[Case, Any], list[Problem]]

_SANITY = "sanity"
_sections: dict[str, "CompareSection"] = {}
_sanity_field = CompareSpec.model_fields[_SANITY]


@dataclass(frozen=True)
class CompareSection:
    """One comparison's part of the case file: ``compare.<name>`` (a ``settings`` model), where
    it sits among the sections (``order``; the plan's pairs follow the same order) and its
    preflight ``rules``."""

    name: str
    settings: type[BaseModel]
    order: int
    rules: Rules


def add_section(section: CompareSection) -> None:
    """Add ``section`` to the case schema (replacing one of the same name)."""
    if section.name == _SANITY:
        raise ValueError(f"'{_SANITY}' is the sanity checks' section, not a comparison")
    _sections[section.name] = section
    _rebuild()


def sections() -> tuple[CompareSection, ...]:
    """The registered sections, in order."""
    return tuple(sorted(_sections.values(), key=lambda s: (s.order, s.name)))


def settings_of(case: BaseCase, name: str) -> Optional[BaseModel]:
    """``case.compare.<name>`` (None: not set, or an arm's case, which has no pairs)."""
    compare = getattr(case, "compare", None)
    return getattr(compare, name, None) if compare is not None else None


def _rebuild() -> None:
    fields = {s.name: FieldInfo.from_annotated_attribute(Optional[s.settings], None)  # type: ignore[arg-type]
              for s in sections()}
    fields[_SANITY] = _sanity_field
    CompareSpec.__pydantic_fields__ = fields
    for model in (CompareSpec, CaseFile, Case):
        model.model_rebuild(force=True)
