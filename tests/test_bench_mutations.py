"""The mutation benches' seeded faults still apply: each row's target line occurs exactly once in
its file of this checkout (a refactor that moves or rewrites the line would otherwise stop the
bench at that row, found only when the bench runs)."""

from pathlib import Path

import pytest

from tests.benches import load_bench

ROOT = Path(__file__).resolve().parents[1]


def _rows():
    mutations = load_bench("mutations")
    rows = [(m.name, m) for m in mutations.MUTATIONS]
    perf = load_bench("perf_mutations")
    rows += [(r.mutation.name, r.mutation) for r in perf.ROWS]
    return rows


ROWS = _rows()


@pytest.mark.parametrize("name,mutation", ROWS, ids=[n for n, _ in ROWS])
def test_every_seeded_fault_finds_its_line_once(name, mutation):
    lines = (ROOT / mutation.file).read_text().split("\n")
    assert lines.count(mutation.old) == 1, f"{name}: {mutation.file} has the line {lines.count(mutation.old)} times"
    assert mutation.new != mutation.old
    if getattr(mutation, "also", None):
        file, old, new = mutation.also
        assert (ROOT / file).read_text().split("\n").count(old) == 1 and new != old, name


@pytest.mark.parametrize("shared_gpu", [False, True], ids=["alone", "shared-gpu"])
def test_gpu_rows_trim_the_graph_case_to_pairs_a_static_fault_can_reach(tmp_path, shared_gpu):
    from harness.arms import plan_case
    from harness.spec.loader import load_cases

    mutations = load_bench("mutations")
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
    mutations = load_bench("mutations")
    dest = tmp_path / mutations.GPU_CASE
    dest.parent.mkdir(parents=True)
    dest.write_text((ROOT / mutations.GPU_CASE).read_text().replace("  resume: ", "  # resume: "))
    with pytest.raises(SystemExit, match="expected one '  resume: '"):
        mutations.trim_gpu_case(tmp_path, False)


def test_a_copy_runs_its_own_harness_first_and_keeps_the_pythonpath_it_was_given(monkeypatch, tmp_path):
    mutations = load_bench("mutations")
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
    perf = load_bench("perf_mutations")
    line = _gate_line("gpu1-qwen3-perf", "golden", ("step_time", "mem_allocated_bytes"))
    assert perf._golden_checks(line.strip()) == ["step_time", "mem_allocated_bytes"]
    assert perf._golden_checks(_gate_line("gpu1-qwen3-perf", "reference", ("loss_rel",)).strip()) == []


def test_failed_lines_picks_exactly_the_fail_and_error_lines():
    mutations = load_bench("mutations")
    out = ("gate: FAIL (exit 1): 2 case(s), 4 verdict entries: 2 pass, 1 fail, 1 error, 0 skipped\n"
           "  FAIL  a / golden: step_time\n"
           "  ERROR b / repeat: rank 1 exited 1\n"
           "  SKIP  c / golden: no golden values\n"
           "FAILED to parse\n")
    assert mutations.failed_lines(out) == ["FAIL  a / golden: step_time", "ERROR b / repeat: rank 1 exited 1"]
    assert mutations.failed_lines("gate: PASS (exit 0): 1 case(s)\n") == []


def test_keep_verdicts_copies_each_cases_verdict_and_nothing_else(tmp_path):
    mutations = load_bench("mutations")
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
    perf = load_bench("perf_mutations")
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


# --------------------------------------------------------------------------- issue 31's guards
def seeded(monkeypatch, name: str) -> None:
    """Apply row ``name``'s one-line fault in this process: the top-level statement of its file
    that holds the line runs again, patched, and every module name it binds anew is
    monkeypatched onto the imported module (what the bench does in a copy of the files)."""
    import ast
    import importlib

    row = next(m for m in load_bench("mutations").MUTATIONS if m.name == name)
    module = importlib.import_module(row.file[:-3].replace("/", "."))
    lines = (ROOT / row.file).read_text().split("\n")
    at = lines.index(row.old)
    lines[at] = row.new
    (node,) = [n for n in ast.parse("\n".join(lines)).body if n.lineno <= at + 1 <= n.end_lineno]
    before = dict(vars(module))
    space = dict(before)
    exec(compile(ast.Module([node], []), row.file, "exec"), space)
    bound = [k for k, v in space.items() if k != "__builtins__" and before.get(k) is not v]
    assert bound, f"{name}: the patched statement binds nothing"
    for key in bound:
        monkeypatch.setattr(module, key, space[key])


def test_the_packer_forgetting_cp_padding_is_caught_on_padded_tokens_only(monkeypatch) -> None:
    from harness.arms import plan_case
    from harness.compare import packing_check, packing_rule
    from harness.results import StepRecord
    from harness.spec.loader import load_cases
    from harness.workload import packing

    (case,) = load_cases([ROOT / "cases/focused/tiny-dcp12-vs-cp2.yaml"])
    dcp = plan_case(case).arm("dcp").case
    seeded(monkeypatch, "packer-forgets-cp-padding")
    plans = [packing.plan_step(dcp, s) for s in range(1, dcp.train.steps + 1)]
    steps = {0: [StepRecord(step=p.step, loss=2.0, grad_norm=1.0, packed=p.packed(),
                            microbatches=len(p.microbatches), tokens=p.total_tokens)
                 for p in plans]}
    check = packing_check("dcp", steps, packing_rule(dcp))
    assert not check.passed and "132 padded to multiples of 4, above cp x max_seqlen_per_rank = " \
                                "128" in check.detail
    # Every group's real tokens are within cp x max_seqlen_per_rank: a real-token check passed it.
    msr = dcp.layout.max_seqlen_per_rank
    assert all(g.tokens <= g.cp * msr for p in plans for mb in p.packed() for g in mb.groups)


def test_a_checkpoint_whose_metadata_names_another_step_fails_loaded_checkpoint_only(
        monkeypatch, tmp_path) -> None:
    """Both legs of the resumed arm in this process (``run_rank``, what every launcher runs per
    rank), the checkpoint saved with the row's fault."""
    from harness.arms import plan_case
    from harness.compare import evaluate_case
    from harness.launch.ranks import rank_main
    from harness.results import ArmOutcome, read_steps
    from harness.spec.loader import load_cases
    from tests.launch.cases import write_case_file

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    path = write_case_file(tmp_path / "cases", "meta", train={"steps": 4},
                           compare={"resume": {}})
    plan = plan_case(load_cases([path])[0])
    arms = {a.name: a for a in plan.arms}
    seeded(monkeypatch, "checkpoint-step-metadata")
    out = tmp_path / "out"
    rank_main.run_rank(arms["eager"], out / "eager")
    first, _ = rank_main.arm_legs(arms["eager-resumed"])
    rank_main.run_rank(arms["eager-resumed"], out / "eager-resumed", stop_after=first)
    rank_main.run_rank(arms["eager-resumed"], out / "eager-resumed")
    resumed = read_steps(out / "eager-resumed")[0]
    assert [(r.resumed_from, r.checkpoint_step) for r in resumed] == [
        (None, None), (None, None), (2, 1), (2, 1)]
    ok = ArmOutcome(status="ok", returncode=0)
    v = evaluate_case("meta", plan.pairs, {a: (ok, read_steps(out / a))
                                           for a in ("eager", "eager-resumed")},
                      expected_steps=4, expected_ranks=plan.expected_ranks)
    (entry,) = [p for p in v.pairs if p.pair == "resume"]
    assert entry.status == "fail" and [c.name for c in entry.failed_checks] == ["loaded_checkpoint"]
    assert "loaded a checkpoint that holds step 1" in entry.failed_checks[0].detail
