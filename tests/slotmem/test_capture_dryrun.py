"""CPU dry run of a whole capture session with stand-ins for CUDA (graphs, streams, pool, allocator
checkpoints): every phase of :mod:`harness.slotmem.capture` runs on CPU tensors, so its Python paths,
phases, invariants and arena wiring are checked without a GPU. A stand-in graph replays nothing, so
this checks structure (and values computed at capture time), not replay; the GPU tests do that."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harness.slotmem import allocator as alloc
from harness.slotmem import capture as capture_mod
from harness.slotmem import procstate as procstate_mod
from harness.slotmem import warmup as warmup_mod
from harness.slotmem.arenas import align
from harness.slotmem.phases import Phase
from harness.slotmem.plan import plan_pipeline
from harness.slotmem.tensors import check_inputs
from tests.slotmem.test_scenarios_cpu import ExpandedSave, Wrapper


class _Graph:
    def __init__(self) -> None:
        self.resets = 0

    def replay(self) -> None:
        pass

    def reset(self) -> None:
        self.resets += 1


class _Stream:
    def wait_stream(self, other: Any) -> None:
        pass


@pytest.fixture
def cuda_standins(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """CUDA replaced by host stand-ins; returns counters of the allocator calls."""
    calls: dict[str, Any] = {"checkpoints": 0, "verify": 0, "graphs": []}
    stream = _Stream()

    def graph() -> _Graph:
        g = _Graph()
        calls["graphs"].append(g)
        return g

    fake_cuda = SimpleNamespace(get_rng_state=lambda device: torch.zeros(1), set_rng_state=lambda s, d: None,
                                current_stream=lambda device: stream, set_stream=lambda s: None)
    monkeypatch.setattr(capture_mod, "_capture_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(alloc, "CaptureGuard", lambda: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "MemPool", lambda: SimpleNamespace(id=(0, 1)))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g, pool=None, stream=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "use_mem_pool", lambda pool: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(procstate_mod.torch, "cuda", torch.cuda)
    real_guard = procstate_mod.ProcessStateGuard
    monkeypatch.setattr(capture_mod, "ProcessStateGuard", lambda device: real_guard(device, fake_cuda))

    def checkpoint(pool: Any, device: Any = None) -> alloc.Checkpoint:
        calls["checkpoints"] += 1
        return alloc.Checkpoint(0, pool, "state", frozenset({1}))

    monkeypatch.setattr(alloc, "checkpoint", checkpoint)
    monkeypatch.setattr(alloc, "quiesce", lambda: None)
    monkeypatch.setattr(alloc, "live_ptrs", lambda pool: frozenset({1}))
    monkeypatch.setattr(alloc, "verify_live", lambda cp: calls.__setitem__("verify", calls["verify"] + 1))
    monkeypatch.setattr(alloc, "check_live", lambda dev, pool, ptrs: True)
    monkeypatch.setattr(alloc, "require_fixed_segments", lambda pool: None)
    monkeypatch.setattr(alloc, "clear_cublas_workspaces", lambda device=None: None)
    monkeypatch.setattr(alloc, "pool_bytes", lambda pool: alloc.PoolBytes(0, 0))
    monkeypatch.setattr(alloc, "restore", lambda cp, stale: pytest.fail("no stale owner on CPU: no restore"))
    monkeypatch.setattr(warmup_mod, "check_inputs", lambda args, where, require_cuda=True: check_inputs(args, where, False))
    real_check_output = warmup_mod.check_output
    monkeypatch.setattr(warmup_mod, "check_output", lambda t, name, require_cuda=True: real_check_output(t, name, False))
    return calls


class Glu(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.norm = torch.nn.LayerNorm(16)
        self.fc1 = torch.nn.Linear(16, 64)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.fc1(self.norm(x)).chunk(2, dim=-1)
        return x + self.fc2(a * torch.sigmoid(b))


def _glu_sample(cp: int, c: int, l: int) -> tuple[torch.Tensor, ...]:
    return (torch.ones(32 // cp, 16, requires_grad=True),)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "copies"])
def test_every_phase_runs_and_checks_its_invariants(cuda_standins: dict[str, Any], direct: bool) -> None:
    plan = plan_pipeline(2, 2, (4,), (1, 2), 2).ranks[0]
    model = [[Glu(10 * c + l) for l in range(2)] for c in range(2)]
    logs: list[str] = []
    graphs = capture_mod.capture_plan(model, _glu_sample, plan, log=logs.append, direct_writes=direct)
    assert graphs.phase is Phase.REPLAY
    assert any("2 dynamic-CP variants over" in s for s in logs), logs
    frames = graphs.frames
    assert len(frames) == 2 * 2 * 2 * plan.physical_slots  # variants x chunks x layers x slots
    assert all(f.bwd is not None and f.roots is None for f in frames.values())
    assert cuda_standins["checkpoints"] == 2 * 2 * 2 * plan.physical_slots  # one per lockstep unit (fwd and bwd)
    st = graphs.stats
    assert st.restores == 0 and st.graphs == 2 * len(frames)
    if direct:
        assert st.direct_writes > st.copies
    else:
        assert st.direct_writes == 0 and st.copies > 0
    # chained layers: layer 1's static input IS layer 0's static output (same bytes)
    f0, f1 = frames[(2, 0, 0, 0)], frames[(2, 0, 1, 0)]
    assert f1.static_inputs[0].data_ptr() == f0.static_outputs[0].data_ptr()
    graphs.close()
    assert graphs.phase is Phase.CLOSED
    assert all(g.resets >= 1 for g in cuda_standins["graphs"])
    with pytest.raises(RuntimeError, match="closed"):
        graphs.layer(0, 0)(torch.ones(16, 16), cp_size=2, microbatch=0)


def _single(cps: tuple[int, ...]) -> Any:
    return plan_pipeline(1, 1, (1,), cps, 1).ranks[0]


def test_output_relations_survive_into_the_static_outputs(cuda_standins: dict[str, Any]) -> None:
    class Both(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.state = torch.nn.Parameter(torch.randn(16))

        def forward(self, inp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            y = inp.square()
            return y, y[4:], self.state.view_as(self.state)

    module = Both()
    graphs = capture_mod.capture_plan([[module]], lambda cp, c, l: (torch.ones(16, requires_grad=True),),
                                      _single((1, 2)), log=lambda s: None)
    for cp in (1, 2):
        y, view, state = graphs.frames[(cp, 0, 0, 0)].static_outputs
        assert view.data_ptr() - y.data_ptr() == 16
        assert state.untyped_storage().data_ptr() == module.state.untyped_storage().data_ptr()
        assert y.untyped_storage().data_ptr() == graphs.backing.untyped_storage().data_ptr()
    out = graphs.layer(0, 0)(torch.ones(16), cp_size=1, microbatch=0)
    assert out[2].untyped_storage().data_ptr() == module.state.untyped_storage().data_ptr()
    assert out[1].data_ptr() - out[0].data_ptr() == 16
    graphs.close()


def test_a_saved_output_and_an_expanded_save_fit_their_arenas(cuda_standins: dict[str, Any]) -> None:
    class Sig(torch.nn.Module):
        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            return inp.sigmoid()

    graphs = capture_mod.capture_plan([[Sig()]], lambda cp, c, l: (torch.ones(1024, requires_grad=True),),
                                      _single((1,)), log=lambda s: None)
    assert graphs.memory().backing == 4 * align(1024 * 4)
    graphs.close()

    class Mod(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return ExpandedSave.apply(x)

    for direct in (True, False):
        g = capture_mod.capture_plan([[Mod()]], lambda cp, c, l: (torch.ones(64, requires_grad=True),),
                                     _single((1, 2)), log=lambda s: None, direct_writes=direct)
        g.close()


def test_metadata_inputs_and_wrapper_state_capture(cuda_standins: dict[str, Any]) -> None:
    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("state", Wrapper(torch.full((8,), 2.0)))

        def forward(self, x: torch.Tensor, count: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            return x.square() * keep.to(x.dtype) * self.state.inner + count.to(x.dtype)

    sample = lambda cp, c, l: (torch.ones(8, requires_grad=True), torch.tensor([cp], dtype=torch.int32),  # noqa: E731
                               torch.ones(8, dtype=torch.bool))
    graphs = capture_mod.capture_plan([[Masked()]], sample, _single((1, 2)), log=lambda s: None)
    ins = graphs.frames[(2, 0, 0, 0)].static_inputs
    assert [t.dtype for t in ins] == [torch.float32, torch.int32, torch.bool]
    assert torch.equal(graphs.frames[(2, 0, 0, 0)].static_outputs[0], torch.full((8,), 4.0))  # 1*1*2 + 2
    with pytest.raises(TypeError, match="input 1 is a bool, not a tensor"):
        graphs.layer(0, 0)(torch.ones(8), True, torch.ones(8, dtype=torch.bool), cp_size=1, microbatch=0)
    graphs.close()


def test_a_failing_capture_resets_its_graphs_and_fails_its_phase(cuda_standins: dict[str, Any],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    sessions: list[Any] = []
    real = capture_mod._Session

    def tracked(*a: Any, **k: Any) -> Any:
        sessions.append(real(*a, **k))
        return sessions[-1]

    monkeypatch.setattr(capture_mod, "_Session", tracked)
    boom = {"n": 0}
    real_backward = real._backward

    def failing_backward(self: Any, v: int, step: Any) -> None:
        boom["n"] += 1
        if boom["n"] == 3:
            raise RuntimeError("boom in backward")
        real_backward(self, v, step)

    monkeypatch.setattr(real, "_backward", failing_backward)
    plan = plan_pipeline(2, 1, (2,), (1, 2), 1).ranks[0]
    with pytest.raises(capture_mod.CaptureError, match="boom in backward"):
        capture_mod.capture_plan([[Glu(1)]], lambda cp, c, l: (torch.ones(32 // cp, 16, requires_grad=True),), plan,
                                 log=lambda s: None)
    (s,) = sessions
    assert s.phase is Phase.FAILED and s.frames == {}
    assert [p.value for p in s.state.history] == ["prepare", "warmup", "layout", "capture", "failed"]
    assert all(g.resets == 1 for g in cuda_standins["graphs"])  # every graph made, also the one that failed
