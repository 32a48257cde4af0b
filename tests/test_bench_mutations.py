"""The mutation benches' seeded faults still apply: each row's target line occurs exactly once in
its file of this checkout (a refactor that moves or rewrites the line would otherwise stop the
bench at that row, found only when the bench runs)."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_bench", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _rows():
    mutations = _load("mutations")
    rows = [(m.name, m) for m in mutations.MUTATIONS]
    perf = _load("perf_mutations")
    rows += [(r.mutation.name, r.mutation) for r in perf.ROWS]
    return rows


ROWS = _rows()


@pytest.mark.parametrize("name,mutation", ROWS, ids=[n for n, _ in ROWS])
def test_every_seeded_fault_finds_its_line_once(name, mutation):
    lines = (ROOT / mutation.file).read_text().split("\n")
    assert lines.count(mutation.old) == 1, f"{name}: {mutation.file} has the line {lines.count(mutation.old)} times"
    assert mutation.new != mutation.old
