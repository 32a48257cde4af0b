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


def _gate_line(case_id: str, pair: str, failed: tuple[str, ...]) -> str:
    """The gate's own line for one failed entry (``harness.report.gate.gate_result``)."""
    from harness.compare.verdicts import CaseVerdict, Check, PairVerdict
    from harness.report.gate import gate_result
    from harness.report.load import CaseView, SweepView

    checks = tuple(Check(n, 2.0, 1.0, False) for n in failed) + (Check("loss", 0.0, 1.0, True),)
    entry = PairVerdict(case_id, pair, pair, ("eager",), checks, "fail")
    case = CaseView(case_id, Path(case_id), None, CaseVerdict(case_id, (entry,), "fail"), True, {})
    message = gate_result(SweepView(Path("sweep"), True, (case,))).message
    (line,) = [x for x in message.splitlines() if x.strip().startswith("FAIL ")]
    return line


def test_golden_checks_reads_the_gates_own_failure_line():
    perf = _load("perf_mutations")
    line = _gate_line("gpu1-qwen3-perf", "golden", ("step_time", "mem_allocated_bytes"))
    assert perf._golden_checks(line.strip()) == ["step_time", "mem_allocated_bytes"]
    assert perf._golden_checks(_gate_line("gpu1-qwen3-perf", "reference", ("loss_rel",)).strip()) == []


def test_failed_lines_picks_exactly_the_fail_and_error_lines():
    mutations = _load("mutations")
    out = ("gate: FAIL (exit 1): 2 case(s), 4 verdict entries: 2 pass, 1 fail, 1 error, 0 skipped\n"
           "  FAIL  a / golden: step_time\n"
           "  ERROR b / repeat: rank 1 exited 1\n"
           "  SKIP  c / golden: no golden values\n"
           "FAILED to parse\n")
    assert mutations.failed_lines(out) == ["FAIL  a / golden: step_time", "ERROR b / repeat: rank 1 exited 1"]
    assert mutations.failed_lines("gate: PASS (exit 0): 1 case(s)\n") == []


def test_keep_verdicts_copies_each_cases_verdict_and_nothing_else(tmp_path):
    mutations = _load("mutations")
    sweep = tmp_path / "sweep"
    for case in ("a", "b"):
        (sweep / case / "eager").mkdir(parents=True)
        (sweep / case / "verdict.json").write_text(f'{{"case_id": "{case}"}}')
        (sweep / case / "case.json").write_text("{}")
        (sweep / case / "eager" / "steps.jsonl").write_text("{}")
    (sweep / "cut").mkdir()  # a case started but cut: no verdict
    (sweep / "cut" / "case.json").write_text("{}")
    (sweep / "summary.md").write_text("x")
    dest = tmp_path / "dest"
    mutations.keep_verdicts(sweep, dest)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "a/verdict.json", "b/verdict.json"]
    assert (dest / "b" / "verdict.json").read_text() == '{"case_id": "b"}'


def test_the_clean_copy_loses_only_its_cases_committed_golden_values(tmp_path):
    perf = _load("perf_mutations")
    golden = tmp_path / "cases/focused/golden"
    for case in ("gpu1-qwen3-perf", "tiny-moe-eager"):
        (golden / case).mkdir(parents=True)
        (golden / case / "golden_values_h200.json").write_text("{}")
    perf.without_golden(tmp_path, "gpu1-qwen3-perf")
    assert not (golden / "gpu1-qwen3-perf").exists()
    assert (golden / "tiny-moe-eager" / "golden_values_h200.json").is_file()
    perf.without_golden(tmp_path, "gpu1-qwen3-perf")  # already gone: nothing to do
    fresh = tmp_path / "fresh"
    (fresh / "gpu1-qwen3-perf").mkdir(parents=True)
    (fresh / "gpu1-qwen3-perf" / "golden_values_h200.json").write_text('{"fresh": 1}')
    perf._with_golden(tmp_path, fresh, "gpu1-qwen3-perf")  # the later rows get the fresh file
    assert (golden / "gpu1-qwen3-perf" / "golden_values_h200.json").read_text() == '{"fresh": 1}'
