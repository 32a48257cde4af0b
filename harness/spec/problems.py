"""A located problem in a case: the field path (as a tuple) and what is wrong with it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

Loc = tuple[Union[str, int], ...]


def at(field: str) -> Loc:
    """The location of a dotted field path: ``"train.seq_length"`` -> ``("train", "seq_length")``."""
    return tuple(field.split("."))


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a case, at ``loc`` (field path; ints index lists)."""

    loc: Loc
    message: str

    @property
    def field(self) -> str:
        """The dotted field path, e.g. ``parallel.dynamic_cp`` or ``data.lengths.max``."""
        return ".".join(str(part) for part in self.loc)


class ProblemError(Exception):
    """Raised by the pure spec helpers (expansion) when a case cannot be built at all."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        super().__init__(f"{problem.field}: {problem.message}")
