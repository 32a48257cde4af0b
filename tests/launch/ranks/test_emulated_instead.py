"""On too few GPUs a GPU case is emulated instead of skipped (``placement.emulated_instead``, the
one rule; ``cli.selection.emulated_on_too_few_gpus`` re-plans): its first and last rank on the GPU
there is, the loss pairs skipped with their reason; with no GPU, or enough, nothing changes."""

from __future__ import annotations

from pathlib import Path

from harness.arms import plan_case
from harness.cli.selection import emulated_on_too_few_gpus
from harness.launch.ranks.placement import emulated_instead, skip_reason
from harness.spec.loader import load_cases

ROOT = Path(__file__).resolve().parents[3]
GPU2 = ROOT / "cases/focused/gpu2-dcp12-ep2-graphs.yaml"
GPU4 = ROOT / "cases/focused/gpu4-dcp12-pp2-vpp2-ep2-graphs.yaml"
EAGER = ROOT / "cases/focused/tiny-moe-eager.yaml"


def _plan(path: Path):
    (case,) = list(load_cases(path))
    return plan_case(case)


def test_one_gpu_emulates_the_first_and_last_rank_of_a_two_gpu_case() -> None:
    plan = _plan(GPU2)
    assert skip_reason(plan, 1) is not None  # what happened before: the whole case skipped
    assert emulated_instead(plan, 1) == (0, 1)
    (new,), (note,) = emulated_on_too_few_gpus([plan], 1)
    assert new.emulated and new.case.emulate.ranks == [0, 1] and skip_reason(new, 1) is None
    assert "1 GPU(s) for 2 ranks: emulated ranks 0, 1 instead of a skip" in note
    skipped = {p.name: p.skipped for p in new.pairs if p.skipped}
    kept = [p.name for p in new.pairs if not p.skipped]
    assert "graph_vs_eager" in kept and "graph_pools" in kept
    assert "reference" in skipped and all(skipped.values())  # each with its reason


def test_four_gpu_case_on_two_gpus_emulates_its_pipeline_ends() -> None:
    plan = _plan(GPU4)
    assert emulated_instead(plan, 2) == (0, 3)


def test_no_gpu_enough_gpus_or_a_cpu_case_change_nothing() -> None:
    plan = _plan(GPU2)
    assert emulated_instead(plan, 0) is None and emulated_instead(plan, 2) is None
    assert emulated_instead(_plan(EAGER), 1) is None
    plans, notes = emulated_on_too_few_gpus([plan], 0)
    assert plans == [plan] and notes == []
