"""The ``compare:`` section's parts: one per registered comparison, its settings and its rules.

A comparison is one module of ``harness.compare.contracts`` (a floor above this one); it
registers itself there (``harness.compare.registry.register``), which adds its part of the case
schema here: the settings model of ``compare.<name>``, the preflight rules of those settings
and what a command case (``command:``) needs of it: the arm roles whose arguments
(``command.arms.<role>``) its arms run, or why a command case cannot have it
(:func:`command_problems`; ``harness.spec.preflight`` runs both). ``harness`` imports
``harness.compare`` when it is imported, so every comparison has registered its section before
any case is read.

Adding a section rebuilds :class:`~harness.spec.schema.CompareSpec` in place (the class every
annotation names stays the same object): its fields are the sections in ``order``, then
``sanity``; the case models that hold it are rebuilt with it. Sections added inside
:func:`adding_sections` (``harness.compare.contracts`` imports every comparison in it) are
rebuilt into the schema once, on the way out: a rebuild of the three case models costs ~20 ms,
once per comparison in every process that imports ``harness`` (each rank process started
afresh among them) before.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from harness.spec.command import built_in_only
from harness.spec.problems import Problem, at
from harness.spec.schema import BaseCase, Case, CaseFile, CompareSpec

# A section's preflight rules: the case (a user's case, or a command case: the rules say which
# apply to it) and its settings -> the problems found.
Rules = Callable[[Case, Any], list[Problem]]


@dataclass(frozen=True)
class CommandRole:
    """An arm role whose arguments (``command.arms.<role>``) a command case with a comparison
    must give: without them two of its arms run the same command. ``why`` says which arm runs
    them (``the graph arm runs it``)."""

    role: str
    why: str


# The roles a command case with a section's settings must give: the case and the settings -> them.
CommandRoles = Callable[[Case, Any], Sequence[CommandRole]]

_SANITY = "sanity"
_sections: dict[str, "CompareSection"] = {}
_adding: list[bool] = []  # one entry per adding_sections() entered and not yet left
_sanity_field = CompareSpec.model_fields[_SANITY]


@dataclass(frozen=True)
class CompareSection:
    """One comparison's part of the case file: ``compare.<name>`` (a ``settings`` model), where
    it sits among the sections (``order``; the plan's pairs follow the same order), its
    preflight ``rules``, and in a command case the arm roles it needs (``command_roles``) or,
    where it has no place there, why (``not_for_commands``)."""

    name: str
    settings: type[BaseModel]
    order: int
    rules: Rules
    command_roles: CommandRoles
    not_for_commands: Optional[str] = None


def add_section(section: CompareSection) -> None:
    """Add ``section`` to the case schema (replacing one of the same name); inside
    :func:`adding_sections`, on its way out."""
    if section.name == _SANITY:
        raise ValueError(f"'{_SANITY}' is the sanity checks' section, not a comparison")
    _sections[section.name] = section
    if not _adding:
        _rebuild()


@contextlib.contextmanager
def adding_sections() -> Iterator[None]:
    """The sections added inside are put into the case schema together, on the way out (however
    it is left), in one rebuild instead of one each."""
    _adding.append(True)
    try:
        yield
    finally:
        _adding.pop()
        if not _adding:
            _rebuild()


def sections() -> tuple[CompareSection, ...]:
    """The registered sections, in order."""
    return tuple(sorted(_sections.values(), key=lambda s: (s.order, s.name)))


def settings_of(case: BaseCase, name: str) -> Optional[BaseModel]:
    """``case.compare.<name>`` (None: not set, or an arm's case, which has no pairs)."""
    compare = getattr(case, "compare", None)
    return getattr(compare, name, None) if compare is not None else None


def command_problems(case: BaseCase) -> list[Problem]:
    """A command case's problems with the sections its ``compare:`` sets, in the sections' order:
    a comparison it cannot have (``not_for_commands``: drop it), and each arm role a comparison
    needs whose arguments the case does not give (once per role, at ``command.arms.<role>``,
    naming the first comparison that needs it). Nothing for a built-in case."""
    cmd = case.command
    if cmd is None or not isinstance(case, Case):
        return []
    problems: list[Problem] = []
    roles: set[str] = set()
    for section in sections():
        settings = settings_of(case, section.name)
        if settings is None:
            continue
        if section.not_for_commands is not None:
            problems.append(built_in_only(f"compare.{section.name}", section.not_for_commands))
            continue
        for need in section.command_roles(case, settings):
            if need.role not in roles and not cmd.arms.get(need.role):
                problems.append(Problem(at(f"command.arms.{need.role}"), (
                    f"compare.{section.name} needs the arguments of this arm role ({need.why}): "
                    "without them both arms run the same command")))
            roles.add(need.role)
    return problems


def _rebuild() -> None:
    fields = {s.name: FieldInfo.from_annotated_attribute(Optional[s.settings], None)  # type: ignore[arg-type]
              for s in sections()}
    fields[_SANITY] = _sanity_field
    CompareSpec.__pydantic_fields__ = fields
    for model in (CompareSpec, CaseFile, Case):
        model.model_rebuild(force=True)
