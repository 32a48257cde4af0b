"""The loopback communicator (emulated ranks) on the CPU: shapes and dtypes of the real calls,
deterministic finite values, exact adjoints under autograd, no host reads, real group layout."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist

from harness.workload.comm import DISTRIBUTED, GroupHandle, all_gather_rows, all_reduce_, all_to_all_counts, all_to_all_rows
from harness.workload.loopback import BANK_ROWS, GRAD_SCALE, Loopback, LoopbackGroup
from harness.workload.optim import all_reduce_grads, global_grad_norm
from harness.workload.runtime import build_groups, pipeline_channels

from tests.workload.factories import make_case


def _handle(size=2, rank=1, comm=None):
    comm = comm or Loopback(seed=3)
    ranks = tuple(range(10, 10 + size))
    return GroupHandle(LoopbackGroup(ranks, "cp2"), size, rank, ranks, comm)


@pytest.fixture
def no_host_reads(monkeypatch):
    """A context in which any tensor -> host read (what a CUDA host synchronisation would be)
    fails; the checks of a test run outside it."""

    def boom(*_a, **_k):
        raise AssertionError("the loopback read a tensor on the host")

    @contextmanager
    def forbidden():
        with monkeypatch.context() as m:
            for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__",
                         "__index__"):
                m.setattr(torch.Tensor, name, boom)
            yield

    return forbidden


def test_all_gather_repeats_the_local_rows_and_its_backward_is_the_adjoint(no_host_reads):
    h = _handle(size=4, rank=2)
    x = torch.randn(5, 3, 2, dtype=torch.float64, requires_grad=True)
    g = torch.randn(20, 3, 2, dtype=torch.float64)
    with no_host_reads():
        y = all_gather_rows(x, h)
        y.backward(g)
    assert y.shape == (20, 3, 2) and y.dtype == x.dtype
    assert all(torch.equal(y[5 * k: 5 * k + 5], x.detach()) for k in range(4))
    assert torch.equal(x.grad, g.view(4, 5, 3, 2).sum(0))


def test_all_gather_and_exchange_pass_gradcheck():
    h = _handle(size=3, rank=1)
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: all_gather_rows(t, h), (x,))
    send, recv = [2, 3, 1], [3, 3, 3]  # as the counts exchange gives: this rank's 3 rows from each
    x = torch.randn(6, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: all_to_all_rows(t, send, recv, h), (x,))
    # the combine trip: blocks of other lengths are fitted (truncated / zero-padded)
    x = torch.randn(9, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: all_to_all_rows(t, recv, send, h), (x,))


def test_exchange_behaves_as_if_every_peer_routed_like_this_rank(no_host_reads):
    h = _handle(size=2, rank=1)
    counts = torch.tensor([3, 1, 2, 4])  # global experts 0..3; this EP rank owns 2 and 3
    x = torch.arange(10, dtype=torch.float32)[:, None].repeat(1, 4).requires_grad_()
    send, recv = [4, 6], [6, 6]
    with no_host_reads():
        got = all_to_all_counts(counts, h)
        out = all_to_all_rows(x, send, recv, h)
        back = all_to_all_rows(out, recv, send, h)  # the combine
        back.sum().backward()
    assert torch.equal(got, torch.tensor([2, 4, 2, 4])) and got.dtype == counts.dtype
    own = x.detach()[4:10]
    assert out.shape == (12, 4) and torch.equal(out, torch.cat([own, own]))
    assert back.shape == x.shape and torch.equal(back[4:], own)  # own rows come back exactly
    assert torch.equal(back[:4], own[:4])  # another rank's block: this rank's rows, fitted
    assert torch.isfinite(x.grad).all() and x.grad.shape == x.shape


def test_reductions_leave_the_local_value(no_host_reads):
    comm = Loopback(seed=1)
    h = _handle(size=8, rank=5, comm=comm)
    x = torch.tensor([1.5, -2.0])
    with no_host_reads():
        out = [all_reduce_(x, h), all_reduce_(x, h, "min")]
    assert all(o is x for o in out) and torch.equal(x, torch.tensor([1.5, -2.0]))
    assert comm.min_int(7, h) == 7


def test_gradient_reduction_keeps_the_real_bucket_and_the_local_grads():
    h = _handle(size=2, rank=0)
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, 2))]
    for i, p in enumerate(params):
        p.grad = torch.full_like(p, float(i + 1))
    all_reduce_grads(params, h)
    assert torch.equal(params[0].grad, torch.ones(3)) and torch.equal(params[1].grad, torch.full((2, 2), 2.0))
    norm = global_grad_norm(params, [], True, False, _handle(size=4, rank=0), torch.device("cpu"))
    assert norm == pytest.approx((3 + 4 * 4) ** 0.5)


def test_pipeline_receive_is_a_function_of_the_tag_and_kind(no_host_reads):
    a, b = Loopback(seed=11), Loopback(seed=11)
    act, grad = LoopbackGroup((0, 4), "p2p 0->1 act"), LoopbackGroup((4, 0), "p2p 1->0 grad")
    a.recv(torch.empty(1, 5), 0, act, tag=0)  # the bank is drawn on first use
    b.recv(torch.empty(1, 5), 0, act, tag=0)
    with no_host_reads():
        x1 = a.recv(torch.empty(7, 5), 0, act, tag=42)
        _ = b.recv(torch.empty(3, 5), 0, act, tag=9)  # another message first: order does not matter
        x2 = b.recv(torch.empty(7, 5), 0, act, tag=42)
    assert torch.equal(x1, x2) and torch.isfinite(x1).all()
    assert not torch.equal(x1, a.recv(torch.empty(7, 5), 0, act, tag=43))
    g = a.recv(torch.empty(7, 5), 0, grad, tag=42)
    assert 0 < g.abs().max() < 10 * GRAD_SCALE and x1.abs().max() > 0.1
    bf = a.recv(torch.empty(4, 5, dtype=torch.bfloat16), 0, act, tag=1)
    assert bf.dtype == torch.bfloat16 and torch.isfinite(bf.float()).all()
    assert not torch.equal(x1, Loopback(seed=12).recv(torch.empty(7, 5), 0, act, tag=42))
    big = a.recv(torch.empty(BANK_ROWS + 5, 5), 0, act, tag=0)  # longer than the bank: rows wrap
    assert torch.equal(big[:5], big[BANK_ROWS:])
    assert a.isend(x1, 4, act, 42).is_completed()


def test_loopback_groups_are_the_real_layout_and_need_no_process_group():
    layout = make_case(world=16, parallel={"pp": 4, "vpp": 2, "ep": 2, "dynamic_cp": [1, 2, 4]},
                       model={"layers": 8}, train={"max_seqlen_per_rank": 16}).layout
    sizes = layout.cp_sizes
    assert not dist.is_initialized() and sizes == (1, 2, 4)
    for rank in (0, 5, 15):
        g = build_groups(layout, rank, torch.device("cpu"), Loopback(seed=0))
        assert g.pp.ranks == layout.pp_ranks(rank) and g.pp_rank == rank // 4
        assert g.pool.ranks == layout.pool_ranks(g.pp_rank)
        assert g.ep.ranks in layout.ep_blocks(g.pp_rank) and rank in g.ep.ranks
        assert g.expert_dp.ranks in layout.expert_dp_groups(g.pp_rank)
        for c in sizes:
            assert g.cp[c].ranks in layout.cp_blocks(g.pp_rank, c) and g.cp[c].size == c
            assert g.cp[c].ranks[g.cp[c].rank] == rank
        assert g.world.size == 16 and g.world.rank == rank
        assert set(g.p2p) == set(pipeline_channels(4))
        for h in (g.world, g.pp, g.pool, g.ep, g.cp[2], g.cp[4]):
            assert isinstance(h.group, LoopbackGroup) and h.comm is g.comm
            assert h.group.ranks == h.ranks
        assert g.cp[1].group is None  # a one-rank group is an identity, as on the real path
        kinds = {key[2]: grp.kind for key, grp in g.p2p.items()}
        assert kinds == {"act": "act", "grad": "grad"}
    assert not dist.is_initialized()


def test_the_real_path_keeps_torch_distributed():
    g = build_groups(make_case().layout, 0, torch.device("cpu"))
    assert g.comm is DISTRIBUTED and g.world.comm is DISTRIBUTED and g.world.group is None
