"""The slot-memory scenarios of Transformer Engine PR #3353 (tests/pytorch/test_cuda_graphs.py at
refs/pull/3353/head), written against our public API (issue 12). Each test names the TE scenario it
covers; docs/internals.md lists them all, with those that do not apply to our API. Small shapes, one
GPU; the CPU halves of the same protections are in test_scenarios_cpu.py."""

from __future__ import annotations

import gc
from typing import Any, Callable

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from harness.slotmem import allocator as alloc
from harness.slotmem.arenas import align
from harness.slotmem.capture import CaptureError, capture_plan
from harness.slotmem.plan import plan_pipeline
from harness.slotmem.protocol import build_slot_map
from tests.slotmem.test_capture_gpu import GluLayer, _exact_math, compare_mixed, make_layers, sampler  # noqa: F401
from tests.slotmem.test_scenarios_cpu import ExpandedSave, Wrapper

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

N = 4096
FIVE = (1, 2, 4, 8, 16)  # five mutually exclusive variants (TE's tests use five branches)


def single(cps: tuple[int, ...], microbatches: int = 1, pp: int = 1) -> Any:
    """One chunk, one layer: PP1 (one slot) or PP2 rank 0 (``microbatches`` forwards outstanding)."""
    return plan_pipeline(pp, 1, (microbatches,), cps, 1).ranks[0]


def same_shape(n: int = N, dtype: torch.dtype = torch.float32) -> Callable[[int, int, int], tuple[torch.Tensor, ...]]:
    return lambda cp, c, l: (torch.ones(n, device="cuda", dtype=dtype, requires_grad=True),)


def capture(module: Any, plan: Any, sample: Any = None, **kw: Any) -> Any:
    return capture_plan([[module]], sample or same_shape(), plan, log=lambda s: None, **kw)


def replay(graphs: Any, x: torch.Tensor, cp: int, mb: int = 0) -> Any:
    return graphs.layer(0, 0)(x, cp_size=cp, microbatch=mb)


def fresh(n: int = N) -> torch.Tensor:
    return torch.randn(n, device="cuda", requires_grad=True)


def assert_grads(graphs: Any, cps: Any, grad_of: Callable[[torch.Tensor], torch.Tensor], mb: int = 0) -> None:
    """Replay forward and backward once per CP size; the input grad must be ``grad_of(input)``."""
    for cp in cps:
        x = fresh()
        replay(graphs, x, cp, mb).sum().backward()
        assert torch.allclose(x.grad, grad_of(x.detach())), f"cp {cp}"


class Square3(torch.nn.Module):
    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return inp.square() * 3.0


def _clean_process_state() -> None:
    assert gc.isenabled()
    assert not torch.cuda.is_current_stream_capturing()
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert _get_current_dispatch_mode_stack() == []
    assert torch.is_grad_enabled()


# --------------------------------------------------------------- restores process state on error


@pytest.mark.parametrize("where", ["warmup", "capture"])
def test_restores_process_state_on_error(where: str) -> None:
    """TE: 'make_graphed_callables restores process state on error' (RNG, hooks, GC, ...)."""

    class Noisy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            capturing = torch.cuda.is_current_stream_capturing()
            if (where == "warmup" and self.calls == 3) or (where == "capture" and capturing):
                raise RuntimeError(f"boom in {where}")
            return x * torch.rand_like(x)  # consumes the CUDA generator

    gc.enable()
    before = torch.cuda.get_rng_state()
    with pytest.raises(CaptureError, match=f"boom in {where}"):
        capture(Noisy().cuda(), single((1, 2)))
    assert torch.equal(torch.cuda.get_rng_state(), before)
    _clean_process_state()


# --------------------------------------------------------------- non-tensor sample arguments


def test_rejects_non_tensor_sample_arguments() -> None:
    """TE: 'slot memory rejects non-Tensor sample kwargs' (our API has positional inputs only)."""

    class Flag(torch.nn.Module):
        def forward(self, x: torch.Tensor, use_bias: object) -> torch.Tensor:
            return x.square() + (1.0 if use_bias else 0.0)

    with pytest.raises(CaptureError, match=r"argument 1 is a bool .*not a tensor"):
        capture(Flag().cuda(), single((1,)), lambda cp, c, l: (torch.ones(8, device="cuda", requires_grad=True), True))
    _clean_process_state()


def test_metadata_as_int_and_bool_tensors_is_captured() -> None:
    """What the training loop passes instead: int/bool metadata tensors with requires_grad=False."""

    class Masked(torch.nn.Module):
        def forward(self, x: torch.Tensor, count: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            return x.square() * keep.to(x.dtype) + count.to(x.dtype)

    meta = {cp: (torch.tensor([cp], device="cuda", dtype=torch.int32), torch.rand(N, device="cuda") > 0.5) for cp in (1, 2)}
    graphs = capture(Masked().cuda(), single((1, 2)), lambda cp, c, l: (torch.ones(N, device="cuda", requires_grad=True),
                                                                         *meta[cp]))
    for cp in (2, 1):
        x = fresh()
        out = graphs.layer(0, 0)(x, *meta[cp], cp_size=cp, microbatch=0)
        assert torch.allclose(out, x.detach().square() * meta[cp][1].float() + cp)
        out.sum().backward()
        assert torch.allclose(x.grad, 2 * x.detach() * meta[cp][1].float())
    graphs.close()


# --------------------------------------------------------------- wrapper-subclass module state


class ScaleByState(torch.autograd.Function):
    """Saves the wrapper itself for backward (as TE saves FP8 weights)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(w)
        return x * w.inner

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (w,) = ctx.saved_tensors
        return g * w.inner, None


@pytest.mark.parametrize("saves_it", [False, True], ids=["unused", "saved"])
def test_handles_wrapper_subclass_module_state(saves_it: bool) -> None:
    """TE: 'handles wrapper subclass module state' (and FP8 parameters): the storage scan looks
    through the wrapper at its inner tensor instead of failing on its invalid storage."""

    class Module(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("state", Wrapper(torch.full((N,), 1.5, device="cuda")))

        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            return ScaleByState.apply(inp, self.state) if saves_it else inp.square()

    graphs = capture(Module(), single((1, 2)))
    assert_grads(graphs, (1, 2), (lambda x: torch.full_like(x, 1.5)) if saves_it else (lambda x: 2 * x))
    graphs.close()


def test_refuses_a_saved_wrapper_that_is_not_module_state() -> None:
    class Module(torch.nn.Module):
        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            return ScaleByState.apply(inp, Wrapper(inp.detach() * 2))

    with pytest.raises(CaptureError, match="wrapper tensor subclass whose bytes are not module state"):
        capture(Module().cuda(), single((1,)))
    _clean_process_state()


# --------------------------------------------------------------- outputs


def test_preserves_aliased_public_outputs() -> None:
    """TE: 'slot output arenas retain overlapping public views across CP branches'."""

    class Module(torch.nn.Module):
        def forward(self, inp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            output = inp.square()
            return output, output[4:]

    graphs = capture(Module().cuda(), single((1, 2)), same_shape(16))
    for cp in (1, 2):
        x = fresh(16)
        out, view = replay(graphs, x, cp)
        assert view.data_ptr() - out.data_ptr() == 4 * out.element_size()
        (out.sum() + view.sum()).backward()
        expected = 2.0 * x.detach()
        expected[4:] *= 2.0
        assert torch.equal(x.grad, expected)
        previous = out[4:].clone()
        with torch.no_grad():
            view.add_(1.0)
        assert torch.equal(out[4:], previous + 1.0)
    graphs.close()


@pytest.mark.parametrize("state_kind", ["parameter", "buffer"])
def test_preserves_public_outputs_aliased_to_module_state(state_kind: str) -> None:
    """TE: 'persistent module-state views remain outside the slot allocator pool'."""

    class Module(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            state = torch.randn(16, device="cuda")
            if state_kind == "parameter":
                self.state = torch.nn.Parameter(state)
            else:
                self.register_buffer("state", state)

        def forward(self, inp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return inp.square(), self.state.view_as(self.state)

    module = Module()
    graphs = capture(module, single((1, 2)), same_shape(16))
    for cp in (1, 2):
        x = fresh(16)
        out, state_out = replay(graphs, x, cp)
        assert state_out.untyped_storage().data_ptr() == module.state.untyped_storage().data_ptr()
        (out.sum() + state_out.sum()).backward()
        assert torch.equal(x.grad, 2.0 * x.detach())
        if state_kind == "parameter":
            assert torch.equal(module.state.grad, torch.ones_like(module.state))
            module.state.grad = None
    graphs.close()


def test_rejects_public_cuda_tensor_subclass_outputs() -> None:
    class OutputTensor(torch.Tensor):
        pass

    class Module(torch.nn.Module):
        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            return inp.square().as_subclass(OutputTensor)

    with pytest.raises(CaptureError, match="tensor subclass outputs"):
        capture(Module().cuda(), single((1,)), same_shape(16))
    _clean_process_state()


def test_does_not_duplicate_output_backed_saves() -> None:
    """TE: 'a saved public output must not also consume spill space in its arena' (sigmoid)."""

    class Module(torch.nn.Module):
        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            return inp.sigmoid()

    graphs = capture(Module().cuda(), single((1,)))
    n = align(N * 4)
    assert graphs.memory().backing == 4 * n  # frame: input + result (output = save), output grad, input grad
    x = fresh()
    replay(graphs, x, 1).sum().backward()
    s = x.detach().sigmoid()
    assert torch.allclose(x.grad, s * (1.0 - s))
    graphs.close()


# --------------------------------------------------------------- variants share memory


@pytest.mark.parametrize("elements", [0, N], ids=["empty", "nonempty"])
def test_variants_share_one_backing(elements: int) -> None:
    """TE: 'mutually exclusive variants must use identical slot storage and output addresses'."""

    class Module(torch.nn.Module):
        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            return inp.square().sum().unsqueeze(0) * 3.0

    graphs = capture(Module().cuda(), single(FIVE), same_shape(elements))
    ptrs = set()
    for cp in FIVE:
        for _ in range(2):  # two complete lifetimes of the slot per variant
            x = fresh(elements)
            out = replay(graphs, x, cp)
            ptrs.add(out.data_ptr())
            out.sum().backward()
            assert torch.allclose(x.grad, 6.0 * x.detach())
    assert len(ptrs) == 1
    assert graphs.stats.restores == 0  # nothing outlived a graph outside the arenas: no rewind was needed
    graphs.close()


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_reuses_lockstep_branches(reverse: bool) -> None:
    """TE: 'lockstep CP branches restore one live slot boundary between captures', replayed in
    capture order and out of it."""

    class Module(torch.nn.Module):
        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            transient = torch.cat((inp.square(), inp.sin(), inp.cos()), dim=0)
            return transient[: inp.numel()] * 3.0

    graphs = capture(Module().cuda(), single(FIVE))
    assert_grads(graphs, [2, 1, 4, 8, 16] if reverse else FIVE, lambda x: 6.0 * x)
    graphs.close()


def test_reclaims_retained_variant_outputs() -> None:
    """TE: 'a module-held source output must not pin a mutually exclusive branch allocation'."""

    class Module(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.retained_output: torch.Tensor | None = None

        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            self.retained_output = inp.square() * 3.0
            return self.retained_output

    module = Module().cuda()
    graphs = capture(module, single(FIVE))
    ptrs = set()
    for cp in FIVE:
        x = fresh()
        out = replay(graphs, x, cp)
        ptrs.add(out.data_ptr())
        out.sum().backward()
        assert torch.allclose(x.grad, 6.0 * x.detach())
    assert len(ptrs) == 1
    module.retained_output = None
    graphs.close()


class Retains(torch.nn.Module):
    """Keeps a capture-time intermediate that is neither an output nor saved: a stale owner."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: torch.Tensor | None = None

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.kept = inp * 2.0
        return inp.square() * 3.0


def test_rewind_keeps_variants_at_one_footprint_when_a_module_keeps_memory() -> None:
    """What the rewind protects, measured: a stale owner per variant is detached and its block
    reused, so five variants take no more pool than one."""
    one = capture(Retains().cuda(), single((1,)))
    one_bytes = one.memory().pool_reserved
    one.close()
    del one
    torch.cuda.empty_cache()
    module = Retains().cuda()
    five = capture(module, single(FIVE))
    assert five.stats.restores > 0 and five.stats.detached_owners >= five.stats.restores
    assert not alloc.has_standard_deleter(module.kept.untyped_storage())
    assert five.memory().pool_reserved <= one_bytes
    assert_grads(five, FIVE, lambda x: 6.0 * x)
    five.close()


@pytest.mark.parametrize("timing", ["detach", "before", "after"])
def test_rolls_back_restore_failure(monkeypatch: pytest.MonkeyPatch, timing: str) -> None:
    """TE: 'a failed allocator restore must put the original owners back before raising' (3
    timings), and the next capture works."""
    if timing != "before" and not alloc.reversible_detach():
        pytest.skip("this torch lacks UntypedStorage._swap_data_ptr_: detaching a stale owner cannot be undone")
    module = Retains().cuda()
    calls = {"set": 0, "swap": 0}
    real_set = torch._C._cuda_setCheckpointPoolState
    real_swap = alloc.swap_owner

    def set_state(*args: Any) -> Any:
        calls["set"] += 1
        if calls["set"] == 1 and timing == "before":
            raise RuntimeError("injected restore failure")
        out = real_set(*args)
        if calls["set"] == 1 and timing == "after":
            raise RuntimeError("injected restore failure")
        return out

    def swap(a: Any, b: Any) -> None:
        calls["swap"] += 1
        real_swap(a, b)
        if calls["swap"] == 1 and timing == "detach":
            raise RuntimeError("injected detach failure")

    monkeypatch.setattr(torch._C, "_cuda_setCheckpointPoolState", set_state)
    monkeypatch.setattr(alloc, "swap_owner", swap)
    with pytest.raises(alloc.PoolStateError, match="rolled back") as info:
        capture(module, single((1, 2)))
    assert calls["set"] == (1 if timing == "detach" else 2)
    assert module.kept is not None and alloc.has_standard_deleter(module.kept.untyped_storage())
    _clean_process_state()
    del info
    monkeypatch.undo()
    gc.collect()
    graphs = capture(module, single((1, 2)))
    assert_grads(graphs, (2, 1), lambda x: 6.0 * x)
    graphs.close()


def test_tracks_native_saved_storage() -> None:
    """TE: 'checkpoint branches must retain allocator owners hidden in autograd saved tensors'."""

    class Module(torch.nn.Module):
        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            hidden = inp * 2.0
            return hidden.square()

    graphs = capture(Module().cuda(), single(FIVE))
    assert_grads(graphs, FIVE, lambda x: 8.0 * x)
    graphs.close()


def test_variants_reuse_native_saved_allocations() -> None:
    """TE: 'forked branches must reuse native saved-tensor allocations, not grow the pool'. The
    canonical variant squares, the others square a sine (set per variant by the variant hook)."""

    class Module(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.canonical = True

        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            return inp.square() if self.canonical else inp.sin().square()

    def run(cps: tuple[int, ...]) -> int:
        module = Module().cuda()
        hook = lambda cp: setattr(module, "canonical", cp == 1)  # noqa: E731
        graphs = capture(module, single(cps, 2, pp=2), variant_hook=hook)
        for m in range(2):
            assert_grads(graphs, cps[:1], lambda x: 2.0 * x, m)
            assert_grads(graphs, cps[1:], lambda x: 2.0 * x.sin() * x.cos(), m)
        reserved = graphs.memory().pool_reserved
        graphs.close()
        return reserved

    two = run((1, 2))
    torch.cuda.empty_cache()
    assert run(FIVE) <= two


# --------------------------------------------------------------- parameter gradients


class Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(N, device="cuda"))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return inp * self.weight


def test_returns_correct_parameter_gradients() -> None:
    """TE: 'mutually exclusive branches must return correct parameter gradients' (and accumulate)."""
    module = Scale()
    graphs = capture(module, single(FIVE))
    for cp in FIVE:
        module.weight.grad = None
        x = fresh()
        replay(graphs, x, cp).sum().backward()
        assert torch.equal(x.grad, module.weight.detach())
        assert torch.equal(module.weight.grad, x.detach())
    module.weight.grad = None
    xs = [fresh() for _ in range(2)]
    for x in xs:
        replay(graphs, x, 1).sum().backward()
    assert torch.equal(module.weight.grad, xs[0].detach() + xs[1].detach())
    graphs.close()


def test_returns_owned_parameter_gradients() -> None:
    """TE: 'replaying one physical slot must not overwrite a retained parameter gradient'."""
    module = Scale()
    graphs = capture(module, single((1,)))
    kept: list[torch.Tensor] = []
    hook = module.weight.register_hook(lambda g: kept.append(g) or g)
    x1 = fresh()
    replay(graphs, x1, 1).sum().backward()
    first = kept[0].clone()
    module.weight.grad = None
    x2 = fresh()
    replay(graphs, x2, 1).sum().backward()
    assert kept[1].data_ptr() != kept[0].data_ptr()
    assert torch.equal(kept[0], first) and torch.equal(kept[0], x1.detach()) and torch.equal(kept[1], x2.detach())
    hook.remove()
    graphs.close()


# --------------------------------------------------------------- saved tensors


class OverlappingSaves(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, inp: torch.Tensor) -> torch.Tensor:
        backing = torch.cat(tuple(inp + v for v in (1.0, 2.0, 3.0, 4.0)))
        ctx.save_for_backward(backing[: 3 * inp.numel()], backing[inp.numel():])
        ctx.n = inp.numel()
        return inp + 0.25

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        first, second = ctx.saved_tensors
        return g * (first[: ctx.n] + second[: ctx.n]) / 2.0


def test_coalesces_overlapping_saved_views() -> None:
    """TE: 'saved views of one storage should occupy only their byte union in each live slot';
    two slots (PP2 rank 0), backwards in reverse."""

    class Module(torch.nn.Module):
        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            return OverlappingSaves.apply(inp)

    graphs = capture(Module().cuda(), single((1, 2), 2, pp=2))
    for cp in (1, 2):
        assert 4 * N * 4 in graphs.plans[(cp, 0, 0)].components  # one component: the union of both views
    x0, x1 = fresh(), fresh()
    out0 = replay(graphs, x0, 2, 0)
    out1 = replay(graphs, x1, 1, 1)
    out1.sum().backward()
    assert torch.allclose(x1.grad, x1.detach() + 1.5)  # a returned input grad is read before the slot's next use
    out0.sum().backward()
    assert torch.allclose(x0.grad, x0.detach() + 1.5)
    graphs.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "copies"])
def test_tracks_expanded_native_saved_storage(direct: bool) -> None:
    """TE: 'arena copies must support saved expanded views with internally overlapping strides'."""

    class Module(torch.nn.Module):
        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            return ExpandedSave.apply(inp)

    graphs = capture(Module().cuda(), single((1, 2)), direct_writes=direct)
    assert_grads(graphs, (2, 1), lambda x: torch.full_like(x, x[0].item() + 3.0))
    graphs.close()


# --------------------------------------------------------------- liveness of slots and inputs


def test_input_staging_respects_overlapping_liveness_and_slot_wrap() -> None:
    """TE: 'live microbatches must not overwrite inputs still needed by backward' and 'a drained
    slot can wrap while another slot's forward remains live' (PP2 rank 0, 2 slots, 3 microbatches)."""
    plan = plan_pipeline(2, 1, (2, 3), (1, 2), 1).ranks[0]
    assert plan.physical_slots == 2
    graphs = capture(Square3().cuda(), plan)
    xs = [torch.full((N,), v, device="cuda", requires_grad=True) for v in (2.0, 3.0, 5.0)]
    outs = [replay(graphs, xs[0], 1, 0), replay(graphs, xs[1], 2, 1)]
    outs[0].sum().backward()
    # returned input grads live in the slot's grad arena: read each before its slot is used again
    assert torch.equal(xs[0].grad, 6.0 * xs[0].detach())
    outs.append(replay(graphs, xs[2], 2, 2))  # slot 0 again, while microbatch 1 is live in slot 1
    outs[1].sum().backward()
    assert torch.equal(xs[1].grad, 6.0 * xs[1].detach())
    outs[2].sum().backward()
    assert torch.equal(xs[2].grad, 6.0 * xs[2].detach())
    graphs.close()


@pytest.mark.parametrize("layers", [(1, 0), (1, 0, 1)], ids=["trailing", "middle"])
def test_skips_zero_layer_pipeline_chunks(layers: tuple[int, ...]) -> None:
    """TE: 'pipeline schedule entries without graphable layers must not consume slot metadata'."""
    vpp = len(layers)
    plan = plan_pipeline(2, vpp, (4,), (1, 2), [list(layers)] * 2).ranks[0]
    model = make_layers(layers, torch.float32)
    graphs = capture_plan(model, sampler(torch.float32), plan, log=lambda s: None)
    smap = build_slot_map(plan.records, layers)
    cp_of = {m: (1, 2)[m % 2] for m in range(4)}
    assert compare_mixed(model, graphs, 2, 0, vpp, plan.group, 4, cp_of, torch.float32, smap) == []
    graphs.close()


# --------------------------------------------------------------- warmup memory


def test_warmup_peak_is_no_higher_than_capture_peak() -> None:
    """Issue 12: warming the variants one at a time keeps warmup at or below the capture's peak."""
    plan = plan_pipeline(2, 2, (4, 6, 8), (1, 2, 4), 2).ranks[0]
    hidden, tokens = 256, 4096  # the shape of bench/graph_memory.py, scaled down
    model = [[GluLayer(hidden, 10 * c + l).cuda() for l in range(2)] for c in range(2)]

    def sample(cp: int, c: int, l: int) -> tuple[torch.Tensor, ...]:
        return (torch.randn(tokens // cp, hidden, device="cuda", requires_grad=True),)

    torch.cuda.empty_cache()
    graphs = capture_plan(model, sample, plan, log=lambda s: None)
    st = graphs.stats
    assert st.peak_allocated_during_warmup <= st.peak_allocated_during_capture, st
    graphs.close()
