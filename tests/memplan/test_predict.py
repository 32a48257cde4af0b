"""harness.memplan: the block's saves on meta are the capture's, the arenas are the slot plan's,
the parts add up, Megatron's estimate is its formula, and plan --memory prints them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.memplan.megatron import megatron_estimate
from harness.memplan.predict import MemoryPlanError, predict_case
from harness.memplan.records import MemoryTarget
from harness.memplan.schedule import held_in_flight
from harness.slotmem import warmup_count
from harness.slotmem.tensors import storage_key
from harness.spec.loader import load_cases

ROOT = Path(__file__).resolve().parents[2]

CASE = """\
name: mem-tiny-graphs
model: {preset: tiny, layers: 4}
parallel: {pp: 2, vpp: 2, ep: 2, dynamic_cp: [1, 2]}
train: {steps: 2, global_batch: 8, seq_length: 128, max_seqlen_per_rank: 64,
        max_seqs_per_microbatch: 8, lr: 1.0e-3, seed: 1, dtype: %s}
data: {lengths: {distribution: lognormal, min: 8, max: 128}}
graphs: {scope: attn, warmup_steps: 1}
compare:
  graph_vs_eager: {loss: exact}
resources: {gpus_per_node: 4, device: cuda}
"""


def _case(tmp_path: Path, dtype: str = "bf16"):
    f = tmp_path / "case.yaml"
    f.write_text(CASE % dtype)
    (case,) = list(load_cases(f))
    return case


def test_meta_storage_keys_follow_storages() -> None:
    a = torch.empty(4, 8, device="meta")
    b = torch.empty(4, device="meta")
    assert storage_key(a) == storage_key(a[1:]) != storage_key(b)


def test_meta_autocast_saves_what_cpu_autocast_saves() -> None:
    from harness.memplan.autocast import MetaAutocast

    lin = torch.nn.Linear(16, 8, bias=False)

    def saves(x: torch.Tensor, ctx) -> list[tuple[tuple[int, ...], torch.dtype]]:
        got = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: got.append((tuple(t.shape), t.dtype)) or t,
                                                      lambda t: t), ctx:
            torch.relu(lin(x)).sum()
        return got

    cpu = saves(torch.randn(4, 16, requires_grad=True), torch.autocast("cpu", dtype=torch.bfloat16))
    lin.to("meta")
    meta = saves(torch.empty(4, 16, device="meta", requires_grad=True), MetaAutocast(torch.bfloat16))
    assert meta == cpu and ((16, 8), torch.bfloat16) in meta  # the bf16 weight copy is saved


def test_in_flight_is_the_schedule_warmup_plus_one() -> None:
    for r in range(4):
        assert held_in_flight(4, 4, r, 4, [8], [1] * 4) == warmup_count(4, r, 8, 4, 4) + 1


def test_plan_parts_add_up_and_the_pool_is_shared(tmp_path: Path) -> None:
    case = _case(tmp_path)
    cm = predict_case(case, MemoryTarget(varlen_native_gqa=False))
    assert [r.pp_rank for r in cm.ranks] == [0, 1]
    for r in cm.ranks:
        assert r.weight_bytes == r.grad_bytes == r.params * 4 and r.optimizer_bytes == r.params * 8
        cp1, cp2 = r.variants
        assert cp2.block_saved_bytes > cp1.block_saved_bytes > 0  # CP2 gathers K/V: more saved
        # one pool for both CP sizes: at least the larger alone, well under the sum
        assert max(cp1.arena_bytes, cp2.arena_bytes) <= r.arena_bytes < cp1.arena_bytes + cp2.arena_bytes
        assert r.pool_shared_bytes < r.pool_separate_bytes == cp1.pool_bytes + cp2.pool_bytes
        assert r.graph_peak_bytes >= r.static_bytes + r.pool_shared_bytes
        assert sum(r.parts().values()) == r.peak_bytes
    # stage 0 holds more microbatches in flight than the last one
    assert cm.ranks[0].in_flight > cm.ranks[1].in_flight


def test_repeated_kv_heads_are_saved(tmp_path: Path) -> None:
    case = _case(tmp_path)
    rep = predict_case(case, MemoryTarget(varlen_native_gqa=False), pp_ranks=[0]).ranks[0]
    try:
        nat = predict_case(case, MemoryTarget(varlen_native_gqa=True), pp_ranks=[0]).ranks[0]
    except MemoryPlanError:
        pytest.skip("this torch's varlen_attn has no enable_gqa")
    assert rep.variants[1].block_saved_bytes > nat.variants[1].block_saved_bytes


def test_fp32_static_cases_are_refused_with_the_reason() -> None:
    (case,) = list(load_cases(ROOT / "cases/focused/tiny-static-dcp12-ep2.yaml"))
    with pytest.raises(MemoryPlanError, match="bf16"):
        predict_case(case)


def test_megatron_estimate_is_its_formula() -> None:
    est = megatron_estimate(hidden=2048, heads=32, kv_heads=4, head_dim=128, layers=16, experts=128,
                            moe_ffn=768, vocab=151936, seq_length=8192, pp=4, vpp=4, ep=2)
    attn = 2 * 2048 * 2048 * (1 + 4 / 32) * 2
    layer = 2 * 2048 * (768 * 64 * 1.5 + 1) + attn
    assert est.weights_and_optimizer_bytes == int(((layer * 16 + 2048) / 4 + 2048 * 151936) * 18)
    act = (8192 * 2048 * 34 * 16 + 8 * 8192 * 4 + 8192 * 2048 * 4) * (1 + 3 / 16) * 1.05
    assert est.activation_bytes == int(act)


def test_plan_memory_json(tmp_path: Path) -> None:
    f = tmp_path / "case.yaml"
    f.write_text(CASE % "bf16")
    out = subprocess.run([sys.executable, "-m", "harness", "plan", str(f), "--memory", "--json",
                          "--varlen-gqa", "repeat"], capture_output=True, text=True, cwd=ROOT, check=True)
    doc = json.loads(out.stdout)
    mem = doc["memory"]
    assert mem["case"] == "mem-tiny-graphs" and len(mem["ranks"]) == 2
    assert mem["ranks"][0]["ranks"] == [0, 1] and mem["peak_bytes"] > 0


def test_a_small_model_with_a_large_vocabulary_peaks_at_the_optimizer_step() -> None:
    # measured on one H200 (bench/RESULTS-log.md): rank 0 of this case peaked at 13,520 MiB, where the
    # activations in flight come to about 11,200: the gradient norm's fp64 copy and square of the
    # embedding's gradient (16 bytes x vocab x hidden) sit over the static bytes and the pool
    (case,) = list(load_cases(ROOT / "cases/focused/gpu1-emulated-dcp12-pp2-vpp2-ep2-graphs.yaml"))
    r = predict_case(case, MemoryTarget(varlen_native_gqa=False), pp_ranks=[0]).ranks[0]
    assert r.step_transient_bytes == 16 * case.model.vocab * case.model.hidden
    assert r.peak_bytes == r.static_bytes + r.pool_shared_bytes + r.step_transient_bytes
    assert "optimizer step transient" in r.parts()
    assert abs(r.peak_bytes / 2**20 / 13_520 - 1) < 0.05


def test_an_eager_arm_of_a_graph_case_is_predicted_its_own_peak_and_no_pool() -> None:
    # measured on one H100 (bench/RESULTS-log.md): the eager `dcp` arm of this case's rank 0 peaked at
    # 11,308 MiB, its `graph` arm at 13,520; the eager arm keeps the case's graphs: section but
    # holds no graph pool, so it must be predicted the eager peak, not the graph arm's
    from harness.arms import plan_case
    from harness.memplan.arm import arm_figures

    (case,) = list(load_cases(ROOT / "cases/focused/gpu1-emulated-dcp12-pp2-vpp2-ep2-graphs.yaml"))
    arms = {a.name: a.case for a in plan_case(case).arms}
    r = predict_case(case, MemoryTarget(varlen_native_gqa=False), pp_ranks=[0]).ranks[0]
    assert r.graph_peak_bytes > r.eager_peak_bytes  # else the test could not tell them apart
    eager = arm_figures(arms["dcp"], r)
    graph = arm_figures(arms["graph"], r)
    assert arms["dcp"].graphs is not None and not arms["dcp"].execution.graphed
    assert (eager.pool_bytes, eager.arena_bytes, eager.peak_bytes) == (None, None, r.eager_peak_bytes)
    assert (graph.pool_bytes, graph.peak_bytes) == (r.pool_shared_bytes, r.graph_peak_bytes)
    assert abs(eager.peak_bytes / 2**20 / 11_308 - 1) < 0.05


@pytest.mark.parametrize("path, part, arm, rank, pool_mib", [
    ("cases/focused/gpu1-qwen3-graphs.yaml", "scope-attn", "graph", 0, 2_716),
    ("cases/focused/gpu1-qwen3-graphs.yaml", "scope-full", "graph", 0, 6_078),
    ("cases/focused/gpu1-emulated-dcp12-pp2-vpp2-ep2-graphs.yaml", None, "graph", 3, 1_816),
    ("cases/focused/gpu1-emulated-dcp12-pp2-vpp2-ep2-graphs.yaml", None, "graph-fixed-cp2", 3, 1_864),
])
def test_the_graph_pool_is_what_the_gpus_reserved(path, part, arm, rank, pool_mib) -> None:
    # measured on one H100 and again on one H200 (bench/RESULTS-log.md, issue 42), torch 2.11 (K/V
    # heads repeated for flash varlen): the pool is the allocator's segments over the backing
    # and the capture's own requests, flash's and the reductions' scratch and cuBLAS's workspace
    from harness.arms import plan_case
    from harness.memplan.arm import arm_figures

    case = next(c for c in load_cases(ROOT / path) if part is None or part in c.id)
    arm_case = next(a.case for a in plan_case(case).arms if a.name == arm)
    r = predict_case(arm_case, MemoryTarget(varlen_native_gqa=False), pp_ranks=[arm_case.layout.pp_rank(rank)])
    assert arm_figures(arm_case, r.ranks[0]).pool_bytes == pool_mib * 2**20


@pytest.mark.parametrize("arm, arenas_mib, peak_mib", [("graph", 4_697.9, 27_787), ("eager", None, 27_532)])
def test_scope_full_is_planned_as_the_gpu_measured(arm, arenas_mib, peak_mib) -> None:
    # measured on one H100, torch 2.11+cu130 (K/V heads repeated for flash varlen), the focused
    # sweep's rank 0 of gpu1-qwen3-graphs.scope-full: graph arm pool 6,078 MiB (checked exactly
    # above), arenas 4,697.9 MiB, peak allocated 27,787 MiB; eager arm peak 27,532 MiB. The static
    # MoE's grouped GEMMs run on meta as on the GPU (torch._grouped_mm on bf16 rows)
    from harness.arms import plan_case
    from harness.memplan.arm import arm_figures

    case = next(c for c in load_cases(ROOT / "cases/focused/gpu1-qwen3-graphs.yaml") if "scope-full" in c.id)
    arm_case = next(a.case for a in plan_case(case).arms if a.name == arm)
    f = arm_figures(arm_case, predict_case(arm_case, MemoryTarget(varlen_native_gqa=False)).ranks[0])
    if arenas_mib is not None:
        assert abs(f.arena_bytes / 2**20 / arenas_mib - 1) < 0.05
    else:
        assert (f.pool_bytes, f.arena_bytes) == (None, None)
    assert abs(f.peak_bytes / 2**20 / peak_mib - 1) < 0.10


def test_the_static_moe_takes_the_gpus_grouped_gemm_on_meta_with_its_scratch() -> None:
    # on meta under the planner's autocast the experts run as the GPU runs them: bf16 rows into
    # torch._grouped_mm (not the host loop, which reads the offsets), each call followed by the
    # kernel's arguments and CUTLASS workspace; CUDA's autocast state is restored on exit
    from harness.memplan.autocast import MetaAutocast
    from harness.memplan.blocks import PoolEvents
    from harness.memplan.kernels import grouped_mm_scratch
    from harness.workload.ep import grouped_dispatch
    from harness.workload.moe import Experts

    t, h, f, e, k = 256, 64, 32, 4, 2
    with torch.device("meta"):
        experts = Experts(e, h, f)
        x = torch.empty(t, h, requires_grad=True)
        top_i = torch.empty(t, k, dtype=torch.long)
        weights = torch.empty(t, k)
    seen = []

    class Calls(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func) == "aten._grouped_mm.default":
                seen.append((args[0].dtype, args[1].dtype))
            return func(*args, **(kwargs or {}))

    before = torch.is_autocast_enabled("cuda")
    with MetaAutocast(torch.bfloat16), PoolEvents() as pool, Calls():
        y = grouped_dispatch(x, top_i, weights, experts, e)
    assert torch.is_autocast_enabled("cuda") == before
    assert seen == [(torch.bfloat16, torch.bfloat16)] * 3 and y.shape == (t, h)
    sizes = [ev[2] for ev in pool.end() if ev[0] == "a"]
    scratch = grouped_mm_scratch(e, t * k // e, f)
    assert scratch == (4 * 24 + 4 * 12 + 3 * 4 * 8, (2 + 2 + 1) * 128 * 132)  # ping-pong: 128 rows a group
    assert sizes.count(scratch[0]) == 3
