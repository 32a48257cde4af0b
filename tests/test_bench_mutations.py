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


@pytest.mark.parametrize("shared_gpu", [False, True], ids=["alone", "shared-gpu"])
def test_gpu_rows_trim_the_graph_case_to_pairs_a_static_fault_can_reach(tmp_path, shared_gpu):
    from harness.arms import plan_case
    from harness.spec.loader import load_cases

    mutations = _load("mutations")
    dest = tmp_path / mutations.GPU_CASE
    dest.parent.mkdir(parents=True)
    dest.write_text((ROOT / mutations.GPU_CASE).read_text())
    mutations.trim_gpu_case(tmp_path, shared_gpu)
    for case in load_cases([dest]):
        pairs = {p.name: p for p in plan_case(case).pairs}
        assert "resume" not in pairs and {"graph_vs_eager", "reference", "golden"} <= set(pairs)
        golden = case.compare.golden
        assert (golden.step_time is None and golden.memory is None) == shared_gpu


def test_trim_gpu_case_refuses_a_case_it_cannot_find_its_lines_in(tmp_path):
    mutations = _load("mutations")
    dest = tmp_path / mutations.GPU_CASE
    dest.parent.mkdir(parents=True)
    dest.write_text((ROOT / mutations.GPU_CASE).read_text().replace("  resume: ", "  # resume: "))
    with pytest.raises(SystemExit, match="expected one '  resume: '"):
        mutations.trim_gpu_case(tmp_path, False)


def test_a_copy_runs_its_own_harness_first_and_keeps_the_pythonpath_it_was_given(monkeypatch, tmp_path):
    mutations = _load("mutations")
    monkeypatch.setenv("PYTHONPATH", "/site-of-wheels")
    assert mutations.copy_pythonpath(tmp_path).split(":") == [str(tmp_path), "/site-of-wheels"]
    monkeypatch.delenv("PYTHONPATH")
    assert mutations.copy_pythonpath(tmp_path) == str(tmp_path)
