"""The code under test: which repository, commit and local changes a sweep ran (recorded in its
manifest's :class:`~harness.results.manifest.SweepStart`, read by ``harness.history``).

A built-in case runs this repository's code (the folder above the ``harness`` package); a
command case runs its command's repository (the git repository holding the command's ``cwd``).
``git`` is asked once per repository when a sweep starts; a folder outside any git repository (an
installed wheel) or a machine without ``git`` gives a version without a commit, never a guess.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Mapping, Optional

from pydantic import BaseModel, ConfigDict

# This repository: the folder above the ``harness`` package (a checkout, or site-packages).
HARNESS_REPO = Path(__file__).resolve().parents[2]
_GIT_TIMEOUT_S = 10


class CodeVersion(BaseModel):
    """One repository a sweep ran: its top folder, its ``HEAD`` commit (None: not a git
    repository, or no git), whether tracked files differed from it (``dirty``), and the cases that
    ran its code; ``position``: the commit's place in the first-parent history (how many commits
    ``git rev-list --first-parent`` counts up to it, itself included; None: unknown), what orders
    a series of the history."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    repo: str
    commit: Optional[str] = None
    dirty: bool = False
    cases: tuple[str, ...] = ()
    position: Optional[int] = None


def _git(folder: Path, *args: str) -> Optional[str]:
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                              timeout=_GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_version(folder: Path, cases: tuple[str, ...] = ()) -> CodeVersion:
    """The version of the git repository holding ``folder`` (tracked files only decide
    ``dirty``: a sweep's own output folder beside the code does not make it dirty)."""
    top = _git(folder, "rev-parse", "--show-toplevel")
    if top is None:
        return CodeVersion(repo=str(Path(folder).resolve()), cases=cases)
    commit = _git(Path(top), "rev-parse", "HEAD")
    status = _git(Path(top), "status", "--porcelain", "--untracked-files=no")
    count = _git(Path(top), "rev-list", "--count", "--first-parent", "HEAD") if commit else None
    return CodeVersion(repo=top, commit=commit, dirty=bool(status), cases=cases,
                       position=int(count) if count and count.isdigit() else None)


def code_versions(folders: Mapping[str, Path]) -> tuple[CodeVersion, ...]:
    """Case id -> the folder of the code it runs, as one version per repository (in the order
    first met), each naming its cases."""
    by_folder: dict[Path, list[str]] = {}
    for case_id, folder in folders.items():
        by_folder.setdefault(Path(folder).resolve(), []).append(case_id)
    by_repo: dict[str, CodeVersion] = {}
    for folder, ids in by_folder.items():
        version = code_version(folder, tuple(ids))
        old = by_repo.get(version.repo)
        by_repo[version.repo] = version if old is None else old.model_copy(
            update={"cases": old.cases + version.cases})
    return tuple(by_repo.values())
