"""The loopback communicator on a CUDA GPU: captured in a CUDA graph, replayed equal to eager,
no host synchronisation; an emulated graph arm against its eager arm, bitwise."""

from __future__ import annotations

import pytest
import torch

from harness.arms import arm_case
from harness.spec.schema import Case
from harness.workload.allocsites import GRAPH_POOL
from harness.workload.comm import GroupHandle, all_gather_rows, all_to_all_counts, all_to_all_rows
from harness.workload.emulate import WeightCache, emulate_rank
from harness.workload.loopback import Loopback, LoopbackGroup

pytestmark = pytest.mark.cuda

MODEL = dict(preset="tiny", layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, experts=4,
             experts_per_token=2, moe_ffn=128, vocab=512, rope_theta=1e6, norm_eps=1e-6,
             aux_loss_coeff=1e-2)


def _cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda", torch.cuda.current_device())


def _calls(comm: Loopback, x: torch.Tensor, rows: torch.Tensor, counts: torch.Tensor,
           buf: torch.Tensor) -> tuple[torch.Tensor, ...]:
    h = GroupHandle(LoopbackGroup((4, 5), "cp2"), 2, 1, (4, 5), comm)
    y = all_gather_rows(x, h)
    ex = all_to_all_rows(rows, [3, 5], [5, 5], h)
    back = all_to_all_rows(ex, [5, 5], [3, 5], h)
    gx, grows = torch.autograd.grad((y.float().square().sum() + back.float().square().sum()), (x, rows))
    got = all_to_all_counts(counts, h)
    comm.recv(buf, 0, LoopbackGroup((0, 4), "p2p 0->1 act"), tag=17)
    return y, ex, back, gx, grows, got, buf


def _case() -> Case:
    return Case.model_validate(dict(
        id="emulated-tiny", name="emulated-tiny", source="<test>", model=MODEL,
        parallel={"pp": 2, "vpp": 2, "ep": 2, "dynamic_cp": [1, 2]},
        train=dict(steps=6, global_batch=16, seq_length=512, max_seqlen_per_rank=256, lr=1e-3, seed=3,
                   deterministic=True, dtype="bf16", max_seqs_per_microbatch=8, checkpoint_every=0,
                   memory_probe_step=3),
        data={"lengths": {"distribution": "lognormal", "min": 16, "max": 512}},
        compare={"graph_vs_eager": {}, "dcp_vs_fixed_cp": {"fixed_cp": 2}, "graph_pools": {}},
        graphs={"scope": "attn", "warmup_steps": 2},
        resources={"gpus_per_node": 4, "device": "cuda"},
    ))


@pytest.mark.parametrize("rank", [0, 3], ids=["first-stage", "last-stage"])
def test_an_emulated_graph_arm_replays_both_cp_sizes_bitwise_equal_to_its_eager_arm(rank, capsys):
    _cuda()
    case, cache = _case(), WeightCache(threads=2)
    eager, graph = [], []
    emulate_rank(arm_case(case, "dcp"), rank, eager.append, weights=cache)
    out = emulate_rank(arm_case(case, "graph"), rank, graph.append, weights=cache, sites=True)
    printed = capsys.readouterr().out
    assert "2 dynamic-CP variants over" in printed
    assert [r.graphed for r in graph] == [False, False, True, True, True, True]
    for key in ("loss", "aux_loss", "grad_norm"):
        assert [getattr(r, key) for r in graph] == [getattr(r, key) for r in eager], key
    assert not any(r.nan or r.skipped for r in graph + eager)
    replayed = {f.cp_size for r in graph for f in r.replays}
    assert replayed == {1, 2}
    assert sum(f.replays for r in graph for f in r.replays) == \
        sum(len(r.cp_sizes) for r in graph if r.graphed) * 2  # 2 layers on this rank
    assert out.sites is not None and any(s.pool == GRAPH_POOL for s in out.sites)
    assert graph[2].memory_probe is not None


def _inputs(dev: torch.device) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    x = torch.randn(64, 2, 32, device=dev, dtype=torch.bfloat16, requires_grad=True)
    rows = torch.randn(8, 16, device=dev, requires_grad=True)
    counts = torch.tensor([1, 2, 3, 4], device=dev)
    return x, rows, counts, torch.empty(100, 256, device=dev)


def test_loopback_calls_never_synchronise_with_the_host():
    dev = _cuda()
    comm, args = Loopback(seed=5), _inputs(_cuda())
    _calls(comm, *args)  # draws the receive bank
    torch.cuda.synchronize(dev)
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = _calls(comm, *args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out[0].shape == (128, 2, 32) and out[1].shape == (10, 16) and out[2].shape == (8, 16)


def test_loopback_calls_capture_and_replay_as_eager():
    dev = _cuda()
    comm, args = Loopback(seed=5), _inputs(dev)
    x, rows, counts, buf = args
    # detached: a result that keeps its autograd graph alive keeps the leaves' AccumulateGrad
    # nodes of the default stream, and the captured backward would then wait on that stream
    eager = [t.detach().clone() for t in _calls(comm, *args)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm up on the capture stream
            _calls(comm, *args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = [t.detach() for t in _calls(comm, *args)]
    buf.zero_()
    graph.replay()
    torch.cuda.synchronize(dev)
    for name, a, b in zip(("gather", "exchange", "combine", "dx", "drows", "counts", "recv"), eager, static):
        assert torch.equal(a, b), name
        assert not a.is_floating_point() or torch.isfinite(a.float()).all(), name
