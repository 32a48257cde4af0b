"""Golden folders that are missing or orphaned: errors in ``validate``, ``run``, ``submit`` and
``gate``, never a silent skip.

A case with ``compare.golden`` keeps its values in ``<dir>/<case id>/`` beside its case file. A
platform without a file there yet is a skip with the record command (``golden-platform``); but

* no folder for the case id at all (a lost or renamed folder, or a typo in ``compare.golden.dir``)
  would silently remove the only guard against faults every arm shares, so it is an error; an
  empty folder (e.g. holding a ``.gitkeep``) says "no values recorded yet" on purpose;
* a folder under a golden dir that no case of the case files beside it defines (an orphan left
  by a renamed case or matrix value) is an error too: its values guard nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from harness.compare.contracts.golden import golden_dir
from harness.errors import ConfigError
from harness.spec.loader import find_case_files, load_case_file
from harness.spec.schema import Case


def _ids_beside(case_file: Path) -> set[str]:
    """Every case id the case files in ``case_file``'s folder define (matrix variants too)."""
    ids: set[str] = set()
    for file in find_case_files([case_file.parent]):
        try:
            ids.update(loaded.case.id for loaded in load_case_file(file))
        except ConfigError:
            continue  # a broken neighbour is reported when it is selected itself
    return ids


def missing_folder(case: Case) -> Path | None:
    """The golden folder ``case`` declares and lacks, or None."""
    if case.compare.golden is None:
        return None
    folder = golden_dir(case) / case.id
    return None if folder.is_dir() else folder


def orphan_folders(cases: Iterable[Case]) -> dict[Path, list[Path]]:
    """Golden dir -> its sub-folders no case of the case files beside it defines, for every
    golden dir the given cases use (only dirs that exist)."""
    out: dict[Path, list[Path]] = {}
    seen: set[Path] = set()
    for case in cases:
        if case.compare.golden is None:
            continue
        root = golden_dir(case)
        if root in seen or not root.is_dir():
            continue
        seen.add(root)
        ids = _ids_beside(Path(case.source))
        orphans = sorted(p for p in root.iterdir() if p.is_dir() and p.name not in ids)
        if orphans:
            out[root] = orphans
    return out


def golden_folder_problems(cases: Sequence[Case]) -> list[str]:
    """One line per missing or orphaned golden folder of ``cases`` (empty: none)."""
    out = [f"{case.source}: case '{case.id}': field 'compare.golden': no golden folder {folder}: "
           f"the case declares golden values but its folder is not there (renamed or lost?); "
           f"restore it, or create it empty (mkdir -p {folder} && touch {folder}/.gitkeep) if no "
           "values are recorded yet, then `dcp-harness golden record`"
           for case in cases if (folder := missing_folder(case)) is not None]
    for root, orphans in orphan_folders(cases).items():
        names = ", ".join(p.name for p in orphans)
        out.append(f"{root}: golden folder(s) {names} match no case id of the case files in "
                   f"{root.parent} (left by a renamed case or matrix value?); rename each to its "
                   "case's id, or remove it")
    return out


def check_golden_folders(cases: Sequence[Case]) -> None:
    """ConfigError listing every missing or orphaned golden folder of ``cases``, one a line, each
    naming the file, case and field or the folder (writes nothing)."""
    problems = golden_folder_problems(cases)
    if problems:
        raise ConfigError("\n".join(problems))
