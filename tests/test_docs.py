"""The docs stand alone and say what the code does: no tracked file points outside the repository
or at a build machine's paths, every relative link of the docs leads to a file (and heading) that
exists, the case-file reference lists every schema field with its bound and every preset with its
values, and the case files the docs show load and plan."""

from __future__ import annotations

import re
import subprocess
import types
from pathlib import Path
from typing import Any, Iterator, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from harness.arms import plan_case
from harness.spec.limits import LIMITS
from harness.spec.loader import cases_from_text
from harness.spec.presets import PRESETS
from harness.spec.schema import CaseFile, ModelPreset, Tolerance

REPO = Path(__file__).resolve().parents[1]
# Written in two parts so that this file does not match itself.
OUTSIDE = re.compile(re.escape("../" + "shared") + "|" + r"(?<![\w.~-])/" + "work/")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
ROW = re.compile(r"^\| `([a-z0-9_.]+)` \|(.*)$", re.M)


def tracked_files() -> list[Path]:
    done = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.decode(errors='replace').strip()}")
    return [REPO / name for name in done.stdout.decode().split("\0") if name]


def doc_pages() -> list[Path]:
    docs = sorted((REPO / "docs").rglob("*.md"))
    return [REPO / "README.md", REPO / "slurm" / "README.md", *docs]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        if line.startswith("#"):
            base = slug(line.lstrip("#"))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def broken_link(page: Path, target: str, root: Path = REPO) -> Union[str, None]:
    """Why a relative link of ``page`` leads nowhere (no file, or no such heading), or None."""
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return f"{page.relative_to(root)}: link to {target}: no such file"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{page.relative_to(root)}: link to {target}: no heading #{anchor} there"
    return None


def test_no_tracked_file_points_outside_the_repository() -> None:
    found = []
    for path in tracked_files():
        if not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", errors="ignore")
        found += [f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
                  for m in OUTSIDE.finditer(text)]
    assert not found, "paths outside the repository:\n" + "\n".join(found)


def test_the_outside_pattern_catches_what_it_is_for() -> None:
    assert OUTSIDE.search("see " + "../" + "shared/DESIGN.md")
    assert OUTSIDE.search("(" + "/work" + "/shared/reference/x.md)")
    assert not OUTSIDE.search("harness/workload/train.py and ~/work" + "/x and a/work" + "/b")


def test_every_relative_link_of_the_docs_leads_somewhere() -> None:
    pages = doc_pages()
    assert len(pages) > 10
    bad = [why for page in pages for target in links(page) if (why := broken_link(page, target))]
    assert not bad, "\n".join(bad)


def test_a_broken_link_or_anchor_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    page.write_text("# Title\n## `compare`: step time, memory\n## Notes\n## Notes\n"
                    "```\n# not a heading\n```\nSee [b](b.md), [c](#notes-1), `[d](d.md)`.\n")
    assert anchors(page) == {"title", "compare-step-time-memory", "notes", "notes-1"}
    assert links(page) == ["b.md", "#notes-1"]
    assert broken_link(page, "#notes-1", tmp_path) is None
    assert broken_link(page, "a.md#compare-step-time-memory", tmp_path) is None
    assert broken_link(page, "b.md", tmp_path) == "a.md: link to b.md: no such file"
    assert broken_link(page, "a.md#not-a-heading", tmp_path) == \
        "a.md: link to a.md#not-a-heading: no heading #not-a-heading there"


def test_every_docs_page_a_tracked_file_names_exists() -> None:
    named = set()
    for path in tracked_files():
        if path.suffix in (".py", ".md", ".yaml", ".sh", ".toml") and path.is_file():
            named |= set(re.findall(r"\bdocs/[\w/.-]+\.md\b", path.read_text(encoding="utf-8")))
    assert "docs/internals.md" in named
    missing = sorted(n for n in named if not (REPO / n).is_file())
    assert not missing, f"named but missing: {missing}"


def schema_fields(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Dotted path of every leaf field a case file can set (a bound is a leaf)."""
    for name, field in model.model_fields.items():
        annotation: Any = field.annotation
        if get_origin(annotation) in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            annotation = args[0] if len(args) == 1 else annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) \
                and annotation is not Tolerance:
            yield from schema_fields(annotation, f"{prefix}{name}.")
        else:
            yield prefix + name


def reference_rows() -> dict[str, str]:
    text = (REPO / "docs" / "case-files.md").read_text(encoding="utf-8")
    return {path: rest for path, rest in ROW.findall(text)}


def test_the_case_file_reference_lists_every_field_with_its_bound() -> None:
    fields, rows = set(schema_fields(CaseFile)), reference_rows()
    assert {"train.steps", "compare.golden.step_time.on_cpu", "emulate.ranks"} <= fields
    missing = sorted(fields - set(rows))
    assert not missing, f"fields without a row in docs/case-files.md: {missing}"
    sections = {f.rsplit(".", 1)[0] for f in fields}
    presets = set(ModelPreset.model_fields)  # the preset table's rows
    stale = sorted(set(rows) - fields - sections - presets)
    assert not stale, f"rows for fields the schema does not have: {stale}"
    wrong = [f"{path}: bound {LIMITS[path].max:,} not in its row"
             for path in sorted(fields & set(LIMITS)) if f"{LIMITS[path].max:,}" not in rows[path]]
    assert not wrong, "\n".join(wrong)


def test_the_preset_table_gives_every_preset_s_values() -> None:
    text = (REPO / "docs" / "case-files.md").read_text(encoding="utf-8")
    header = re.search(r"^\| preset field \|(.*)\|$", text, re.M)
    assert header, "docs/case-files.md has no preset table"
    names = [c.strip().strip("`") for c in header.group(1).split("|")]
    assert sorted(names) == sorted(PRESETS)
    table = {}
    for path, rest in ROW.findall(text):
        if path in ModelPreset.model_fields:
            table[path] = [float(c) for c in rest.strip().rstrip("|").split("|")]
    assert set(table) == set(ModelPreset.model_fields)
    for field, values in table.items():
        assert values == [float(getattr(PRESETS[n], field)) for n in names], field


@pytest.mark.parametrize("page", ["README.md", "docs/case-files.md"])
def test_the_case_files_a_page_shows_load_and_plan(page: str) -> None:
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", (REPO / page).read_text(), re.S)
              if re.search(r"^name:", b, re.M)]
    assert blocks
    for block in blocks:
        for loaded in cases_from_text(block, page):
            assert plan_case(loaded.case).arm_names


def test_ci_runs_the_readme_s_quick_start() -> None:
    readme = (REPO / "README.md").read_text()
    quick = re.search(r"## Quick start\n\n```bash\n(.*?)```", readme, re.S)
    assert quick
    commands = quick.group(1).strip().splitlines()
    assert len(commands) == 2
    ci = (REPO / ".ci" / "run").read_text()
    for command in commands:
        assert command.replace("pip install -e", "pip install -q -e") in ci, command
