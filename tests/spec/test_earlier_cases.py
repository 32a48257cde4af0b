"""Case files that validated in an earlier release validate now, with the deprecation warnings
``harness.spec.deprecations`` gives (each naming the field and its fix), and no others.

The corpus, ``tests/spec/earlier_cases/``: every repository case file as first written and as of
the previous release (main of 2026-12-05, d4a0844), taken from git history (each names its path
and commit in its first line; their golden folders are empty: a folder says "no values yet"),
and files written from that release's docs/command-cases.md (``user-*``). A file's
``# warns: FIELD`` lines are the deprecations it must give.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from harness.arms import plan_case
from harness.cli import main
from harness.spec.deprecations import DEPRECATED, CaseFileDeprecation
from harness.spec.loader import load_cases

CORPUS = Path(__file__).parent / "earlier_cases"
FILES = sorted(CORPUS.glob("*.yaml"))
REPO = Path(__file__).resolve().parents[2]


def _expected(path: Path) -> list[str]:
    return re.findall(r"^# warns: (\S+)$", path.read_text(encoding="utf-8"), re.M)


def _field(warning: warnings.WarningMessage) -> str:
    found = re.search(r"field '([^']+)': deprecated since", str(warning.message))
    assert found, str(warning.message)
    return found.group(1)


def test_the_corpus_holds_history_and_every_deprecation() -> None:
    history = [f for f in FILES if not f.name.startswith("user-")]
    assert len(history) >= 40 and all(
        re.match(r"# cases/\S+\.yaml at [0-9a-f]{7} \(2026-", f.read_text().splitlines()[0])
        for f in history)
    warned = {field for f in FILES for field in _expected(f)}
    for entry in DEPRECATED:  # every entry has a file of its shape
        assert any(entry.matches(field) for field in warned), entry.field


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_an_earlier_case_file_loads_and_plans_with_its_warnings(path: Path) -> None:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        plans = [plan_case(case) for case in load_cases([path])]
    assert plans
    ours = [w for w in got if issubclass(w.category, CaseFileDeprecation)]
    assert sorted(_field(w) for w in ours) == sorted(_expected(path))
    for w in ours:
        assert str(w.message).startswith(f"{path}: case '{plans[0].case.name}")
        assert "; fix: " in str(w.message)


@pytest.mark.parametrize("name, fix", [
    ("user-dcp-graph-both-fixed-roles", "drop it (command.arms.graph-fixed-cp gives that arm's "
                                        "arguments)"),
    ("user-dcp-eager-arguments", "move it to command.arms.dcp"),
    ("2026-12-05-d4a0844-tiny-dcp12-vs-cp2", None),
])
def test_validate_prints_each_deprecation_as_one_warning_line(
        name: str, fix: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    path = CORPUS / f"{name}.yaml"
    assert main(["validate", str(path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == len(_expected(path))
    if fix is not None:
        (line,) = err
        assert line.startswith(f"warning: {path}: case '") and line.endswith(f"fix: {fix}")
        assert "deprecated since 2026-12-06" in line and "read as before" in line


def test_the_docs_list_every_deprecation() -> None:
    text = (REPO / "docs" / "case-files.md").read_text(encoding="utf-8")
    for entry in DEPRECATED:
        assert f"`{entry.field}`" in text, entry.field
