"""Loading and selecting cases for a command (PATHS, ``-k``, ``--tags``), with one message for an
empty selection that names only the filters the user gave."""

from __future__ import annotations

from typing import Optional, Sequence

from harness.errors import ConfigError
from harness.spec import Case, load_cases, select_cases


def filters_text(k: Optional[str], tags: Optional[Sequence[str]]) -> str:
    """``-k 'EXPR' --tags a b``: the filters given, as typed ("" for none)."""
    given = ([f"-k {k!r}"] if k is not None else []) + ([f"--tags {' '.join(tags)}"] if tags else [])
    return " ".join(given)


def selected_cases(paths: Sequence[str], k: Optional[str] = None,
                   tags: Optional[Sequence[str]] = None) -> list[Case]:
    """The cases of ``paths`` that ``-k``/``--tags`` keep; ConfigError when none is left."""
    cases = select_cases(load_cases(list(paths)), k=k, tags=tags)
    if not cases:
        where = " ".join(str(p) for p in paths)
        raise ConfigError(f"no case selected: the case files in {where} are valid, but none matches "
                          f"{filters_text(k, tags)}; `dcp-harness validate {where}` lists them")
    return cases
