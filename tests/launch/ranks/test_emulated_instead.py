"""On too few GPUs a GPU case is emulated instead of skipped (``placement.emulated_instead``, the
one rule; ``cli.selection.emulated_on_too_few_gpus`` re-plans): its pipeline's ends on the GPU there
is (one rank for one stage), for fewer steps, the loss pairs skipped with their reason; with no
GPU, or enough, nothing changes."""

from __future__ import annotations

from pathlib import Path

from harness.arms import plan_case
from harness.cli.selection import emulated_on_too_few_gpus
from harness.launch.ranks.placement import emulated_instead, skip_reason
from harness.spec.derive import EMULATED_GRAPHED_STEPS, emulated_steps, with_steps
from harness.spec.loader import load_cases

ROOT = Path(__file__).resolve().parents[3]
GPU2 = ROOT / "cases/focused/gpu2-dcp12-ep2-graphs.yaml"
GPU4 = ROOT / "cases/focused/gpu4-dcp12-pp2-vpp2-ep2-graphs.yaml"
EAGER = ROOT / "cases/focused/tiny-moe-eager.yaml"


def _plan(path: Path):
    (case,) = list(load_cases(path))
    return plan_case(case)


def test_one_gpu_emulates_one_rank_of_a_one_stage_two_gpu_case_for_fewer_steps() -> None:
    # PP 1: the first and the last rank are in the one stage, which holds the same bytes, slots
    # and graphs on every rank: one emulated rank judges them (half the processes)
    plan = _plan(GPU2)
    assert plan.case.layout.pp == 1 and plan.case.train.steps == 20
    assert skip_reason(plan, 1) is not None  # what happened before: the whole case skipped
    assert emulated_instead(plan, 1) == (0,)
    (new,), (note,) = emulated_on_too_few_gpus([plan], 1)
    assert new.emulated and new.case.emulate.ranks == [0] and skip_reason(new, 1) is None
    # the graph warmup (2) plus EMULATED_GRAPHED_STEPS, on every arm
    assert emulated_steps(plan.case) == 2 + EMULATED_GRAPHED_STEPS == 8
    assert {a.case.train.steps for a in new.arms} == {8}
    assert "1 GPU(s) for 2 ranks: emulated rank 0 for 8 of its 20 steps instead of a skip" in note
    skipped = {p.name: p.skipped for p in new.pairs if p.skipped}
    kept = [p.name for p in new.pairs if not p.skipped]
    assert "graph_vs_eager" in kept and "graph_pools" in kept
    assert "reference" in skipped and all(skipped.values())  # each with its reason


def test_four_gpu_case_on_two_gpus_emulates_its_pipeline_ends() -> None:
    plan = _plan(GPU4)
    assert emulated_instead(plan, 2) == (0, 3)


def test_the_emulated_steps_replay_both_cp_sizes_and_keep_the_memory_probe() -> None:
    # what variants_replayed needs of the fewer steps: both CP sizes packed on a graphed step
    from harness.workload.packing import plan_step

    for path in (GPU2, GPU4):
        plan = _plan(path)
        steps = emulated_steps(plan.case)
        graphed = range(plan.case.graphs.warmup_steps + 1, steps + 1)
        sizes = {g.cp for s in graphed for m in plan_step(plan.case, s).packed() for g in m.groups}
        assert sizes == set(plan.case.layout.cp_sizes) == {1, 2}
    case = _plan(GPU2).case
    probed = with_steps(case.model_copy(update={"train": case.train.model_copy(
        update={"memory_probe_step": 12})}), 8)
    assert probed.train.steps == 8 and probed.train.memory_probe_step == 8
    assert with_steps(case, case.train.steps) is case


def test_no_gpu_enough_gpus_or_a_cpu_case_change_nothing() -> None:
    plan = _plan(GPU2)
    assert emulated_instead(plan, 0) is None and emulated_instead(plan, 2) is None
    assert emulated_instead(_plan(EAGER), 1) is None
    plans, notes = emulated_on_too_few_gpus([plan], 0)
    assert plans == [plan] and notes == []


def test_gate_trusts_an_emulated_instead_plan_of_the_case_file_as_it_is(tmp_path: Path) -> None:
    # gate checks that a sweep ran the case its file defines (trust.stored_plan.check_source):
    # an emulated-instead plan (fewer steps) is a derivation of the file as it is, not a change
    # (a later `gate` of an H100 sweep said "changed: train" for both multi-GPU cases)
    import pytest

    from harness.caseplan import PlanError
    from harness.trust.stored_plan import check_source

    for path in (GPU2, GPU4):
        (new,), _ = emulated_on_too_few_gpus([_plan(path)], 1)
        assert new.case.train.steps < _plan(path).case.train.steps
        check_source(new)  # raises PlanError if the derivation is not recognised
    # the same plan against a file that changed is still refused, naming the field
    edited = tmp_path / GPU2.name
    edited.write_text(GPU2.read_text().replace("lr: ", "lr: 2.0e-3 #", 1))
    (case,) = list(load_cases(edited))
    (new,), _ = emulated_on_too_few_gpus([plan_case(case)], 1)
    edited.write_text(GPU2.read_text())
    with pytest.raises(PlanError, match="changed: train"):
        check_source(new)
