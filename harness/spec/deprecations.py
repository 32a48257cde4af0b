"""Case files of an earlier shape: read as the release that accepted them read them, with a
warning that says the fix. One table, :data:`DEPRECATED`.

A case file that validated in the previous release validates now. Where this release would
refuse a field an earlier one accepted, the field's entry says why it is not used, where it
belongs now (``moved_to``, or nowhere: drop it) and since which change. The case is read as
before (a field that is not used where it stands was not used by the earlier release either, so
a sweep of it runs what it ran) and a :class:`CaseFileDeprecation` names the file, the case, the
field and the fix; ``dcp-harness`` prints each as one ``warning:`` line. A later release may
refuse them. The shapes, found on the corpus of earlier case files in
``tests/spec/earlier_cases/`` (every repository case file as first written and as of the
previous release, and files written from that release's docs):

* ``command.arms.<role>`` that no planned arm runs (ignored in silence until f918e31 made it an
  error): the entry of the role it moved to where that role's arm is planned (``fixed-cp``
  beside ``graph`` belongs to ``graph-fixed-cp``; ``eager`` in a dynamic-CP case to ``dcp``),
  else the catch-all (drop it, or add the comparison that runs it). ``harness.arms`` finds them
  when it plans the arms (:func:`unused_command_role`).

Adding a shape: one entry (and a file of that shape in the corpus).
"""

from __future__ import annotations

import fnmatch
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

# The release that read these shapes in silence (main of 2026-12-05, d4a0844) and the change
# after it that refuses them.
UNUSED_ROLES_REFUSED = "2026-12-06 (f918e31)"


class CaseFileDeprecation(FutureWarning):
    """A case file of an earlier shape, read as before (``FutureWarning``: shown to users)."""


@dataclass(frozen=True)
class Deprecated:
    """A field as earlier case files wrote it (``field``; ``*`` matches one key), why this
    release does not use it where it stands, where it belongs now (``moved_to``; None: nowhere),
    and ``since``: the change after which it is refused."""

    field: str
    why: str
    since: str
    moved_to: Optional[str] = None

    def matches(self, field: str) -> bool:
        return fnmatch.fnmatchcase(field, self.field)

    def fix(self, given: Callable[[str], bool]) -> str:
        """What to write instead; ``given(path)``: whether the case gives a field already."""
        if self.moved_to is None:
            return "drop it, or add the comparison that runs it"
        if given(self.moved_to):
            return f"drop it ({self.moved_to} gives that arm's arguments)"
        return f"move it to {self.moved_to}"


DEPRECATED: tuple[Deprecated, ...] = (
    Deprecated("command.arms.fixed-cp", moved_to="command.arms.graph-fixed-cp",
               why="with command.arms.graph, compare.dcp_vs_fixed_cp compares the graph arms "
                   "(graph against graph-fixed-cp<N>)", since=UNUSED_ROLES_REFUSED),
    Deprecated("command.arms.graph-fixed-cp", moved_to="command.arms.fixed-cp",
               why="without command.arms.graph, compare.dcp_vs_fixed_cp compares dcp against "
                   "fixed-cp<N>", since=UNUSED_ROLES_REFUSED),
    Deprecated("command.arms.eager", moved_to="command.arms.dcp",
               why="a dynamic-CP case's first arm is dcp", since=UNUSED_ROLES_REFUSED),
    Deprecated("command.arms.dcp", moved_to="command.arms.eager",
               why="a fixed-CP case's first arm is eager", since=UNUSED_ROLES_REFUSED),
    Deprecated("command.arms.*", why="no comparison the case sets runs that role",
               since=UNUSED_ROLES_REFUSED),
)


def entry_for(field: str, planned: Callable[[str], bool]) -> Optional[Deprecated]:
    """The entry of ``field``: the first that matches it and whose ``moved_to`` is used in this
    case (``planned(path)``), or that has none; None when no entry matches."""
    return next((d for d in DEPRECATED if d.matches(field)
                 and (d.moved_to is None or planned(d.moved_to))), None)


def warn(source: str, case_id: str, field: str, entry: Deprecated, what: str,
         given: Callable[[str], bool]) -> None:
    """One :class:`CaseFileDeprecation`, worded as a ``CaseError`` is (file, case, field)."""
    warnings.warn(CaseFileDeprecation(
        f"{source}: case '{case_id}': field '{field}': deprecated since {entry.since}: {what} "
        f"({entry.why}); read as before, a later release will refuse it; fix: "
        f"{entry.fix(given)}"),
        stacklevel=3)


def unused_command_role(source: str, case_id: str, role: str, arms: dict[str, list[str]],
                        run: set[str]) -> None:
    """Warn that ``command.arms.<role>`` is not used: no planned arm runs it (``run``: the
    roles that are)."""
    field = f"command.arms.{role}"

    def planned(path: str) -> bool:
        return path.rsplit(".", 1)[-1] in run

    def given(path: str) -> bool:
        return bool(arms.get(path.rsplit(".", 1)[-1]))

    entry = entry_for(field, planned)
    assert entry is not None, field  # the catch-all matches every role
    warn(source, case_id, field, entry,
         f"no arm of this case runs the '{role}' role, so its arguments are not used", given)
