"""CPU halves of the Transformer Engine #3353 slot-memory scenarios (issue 12): the parts of each
protection that need no GPU. The GPU halves are in test_te3353_scenarios.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from harness.slotmem import allocator as alloc
from harness.slotmem import capture as capture_mod
from harness.slotmem.arenas import (
    ALIGN,
    EXTERNAL,
    NATIVE,
    TensorMeta,
    align,
    frame_layout,
    group_storage,
    plan_arenas,
    view_at,
)
from harness.slotmem.phases import Phase, PhaseError, PhaseState
from harness.slotmem.procstate import ProcessStateGuard
from harness.slotmem.saved import ArenaPacker, SaveObserver, copy_view
from harness.slotmem.tensors import WarmupError, check_inputs, inner_tensors, storage_keys
from harness.slotmem.warmup import external_storages, ordered_warmup, warmup_steps


def _warm(module: torch.nn.Module, sample: Any, iters: int = 1) -> Any:
    return ordered_warmup({(0, 0): module}, sample, warmup_steps((1, -1), (1,), (1,), iters), require_cuda=False)[
        (1, 0, 0)]


# ----------------------------------------------------------------------------- non-tensor arguments


class _Flag(torch.nn.Module):
    def forward(self, x: torch.Tensor, flag: object) -> torch.Tensor:
        return x * 2 if flag else x


def test_a_non_tensor_sample_argument_is_refused_naming_it() -> None:
    with pytest.raises(WarmupError, match=r"sample_args\(cp_size=1, chunk=0, layer=0\): argument 1 is a bool"):
        _warm(_Flag(), lambda cp, c, l: (torch.ones(4, requires_grad=True), True))
    with pytest.raises(WarmupError, match="not a tensor.*int/bool tensor with requires_grad=False"):
        check_inputs((torch.ones(1), 3), "here", require_cuda=False)
    with pytest.raises(WarmupError, match="must return a tuple of tensors"):
        check_inputs(torch.ones(1), "here", require_cuda=False)
    with pytest.raises(WarmupError, match="on cpu; graph inputs must be CUDA tensors"):
        check_inputs((torch.ones(1),), "here", require_cuda=True)
    # metadata as an int/bool tensor is fine
    assert len(check_inputs((torch.ones(2), torch.tensor([1, 0]), torch.tensor(True)), "here", False)) == 3


# ----------------------------------------------------------------------------- wrapper subclasses


class Wrapper(torch.Tensor):
    """A wrapper subclass (like an FP8 tensor): no storage of its own, its bytes in ``inner``."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor, flatten: bool = True) -> "Wrapper":
        t = torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), storage_offset=0,
                                                dtype=inner.dtype, device=inner.device, requires_grad=False)
        t.inner = inner
        t.flatten = flatten
        return t

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        if not self.flatten:
            raise RuntimeError("no flatten context here")
        return ["inner"], None

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        raise RuntimeError("Wrapper is module state and is never dispatched")


def test_wrapper_subclass_storage_is_found_through_its_inner_tensors() -> None:
    inner = torch.ones(4)
    for flatten in (True, False):  # by __tensor_flatten__, else by its attributes
        w = Wrapper(inner, flatten)
        with pytest.raises(RuntimeError, match="invalid python storage"):
            w.untyped_storage().data_ptr()  # what the storage scan used to trip over
        assert inner_tensors(w) == [inner]
        assert storage_keys(w) == {inner.untyped_storage().data_ptr()}

    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("state", Wrapper(inner))
            self.lin = torch.nn.Linear(4, 4)

    assert inner.untyped_storage().data_ptr() in external_storages(Holder())


def test_a_saved_wrapper_subclass_is_module_state_or_refused() -> None:
    state = torch.ones(4)
    obs = SaveObserver({state.untyped_storage().data_ptr()}, [])
    obs.pack(Wrapper(state))
    assert obs.raw[0][0] == EXTERNAL
    with pytest.raises(WarmupError, match="wrapper tensor subclass whose bytes are not module state"):
        obs.pack(Wrapper(torch.zeros(4)))
    entries = obs.groups().saved
    packer = ArenaPacker("w", entries, [None], {state.untyped_storage().data_ptr()}, [])
    assert packer.pack(Wrapper(state)) is not None


# ----------------------------------------------------------------------------- outputs and components


class _Aliased(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.square()
        return y, y[4:]


class _StateOut(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.state = torch.nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.square(), self.state.view_as(self.state)


class _Sigmoid(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sigmoid()


def _sample16(cp: int, c: int, l: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(16, requires_grad=True),)


def test_outputs_that_alias_each_other_share_one_component() -> None:
    plan = _warm(_Aliased(), _sample16)
    a, b = plan.output_places
    assert a.kind == b.kind == NATIVE and a.component == b.component
    assert b.rel_byte - a.rel_byte == 4 * 4
    fl = frame_layout(plan)
    assert fl.outputs[1] - fl.outputs[0] == 16
    assert not plan.output_alone(0)


def test_an_output_of_module_state_takes_no_arena_bytes() -> None:
    plan = _warm(_StateOut(), _sample16)
    assert [p.kind for p in plan.output_places] == [NATIVE, EXTERNAL]
    fl = frame_layout(plan)
    assert fl.outputs[1] == -1
    assert fl.nbytes == align(16 * 4) * 2  # the input and the square's storage, nothing for the state


def test_a_saved_output_is_stored_once() -> None:
    """Sigmoid saves its result, which is also the output: one component (TE: 'does not duplicate
    output-backed saves'). Arenas: input + result, plus output-grad scratch and input grad."""
    plan = _warm(_Sigmoid(), lambda cp, c, l: (torch.randn(4096, requires_grad=True),))
    n = align(4096 * 4)
    assert plan.components == (4096 * 4,)
    assert plan.output_places[0].component == 0
    assert any(e.kind == NATIVE and e.component == 0 for e in plan.saved)
    fl = frame_layout(plan)
    assert fl.nbytes == 2 * n
    layout = plan_arenas({(1, 0, 0): plan}, (1,), (1,), {(0, 0, 0): 0}, {(0, 0): 0})
    assert layout.backing.nbytes == 4 * n  # 5x before: the output had a region of its own


def test_chaining_skips_an_output_that_is_also_saved() -> None:
    """Layer l's input may be staged in layer l-1's output view only if no save of layer l-1 shares
    those bytes: a copy of a different tensor into the staged input would overwrite that save."""
    sig = _warm(_Sigmoid(), _sample16)
    sq = _warm(_Aliased(), _sample16)
    glu = _warm(torch.nn.Linear(16, 16), lambda cp, c, l: (torch.randn(3, 16, requires_grad=True),))
    from harness.slotmem.arenas import can_chain

    assert not can_chain({(1, 0, 0): sig, (1, 0, 1): sig}, (1, 0, 1))
    assert not can_chain({(1, 0, 0): sq, (1, 0, 1): sq}, (1, 0, 1))  # two outputs
    assert can_chain({(1, 0, 0): glu, (1, 0, 1): glu}, (1, 0, 1))


# ----------------------------------------------------------------------------- expanded saved views


def test_self_overlap_is_detected_from_strides() -> None:
    assert TensorMeta((4, 8), (0, 1), torch.float32).overlaps_itself
    assert TensorMeta((4, 8), (4, 1), torch.float32).overlaps_itself  # rows overlap by 4 elements
    assert not TensorMeta((4, 8), (8, 1), torch.float32).overlaps_itself
    assert not TensorMeta((4, 8), (1, 4), torch.float32).overlaps_itself  # transposed
    assert not TensorMeta((1, 8), (0, 1), torch.float32).overlaps_itself  # size-1 dims do not count
    assert not TensorMeta((0, 8), (0, 1), torch.float32).overlaps_itself


class ExpandedSave(torch.autograd.Function):
    """Saves an expanded (stride-0) view of a one-row result (TE's expanded-save scenario)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward((x[:1] + 3.0).expand_as(x))
        return x + 1.0

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (saved,) = ctx.saved_tensors
        return g * saved


def test_an_expanded_save_is_copied_into_its_arena_view() -> None:
    x = torch.randn(8, 16, requires_grad=True)
    obs = SaveObserver(set(), [x])
    with torch.autograd.graph.saved_tensors_hooks(obs.pack, obs.unpack):
        ExpandedSave.apply(x)
    g = obs.groups()
    entries, comps = g.saved, g.components
    assert comps == (16 * 4,) and entries[0].meta.stride == (0, 1)
    backing = torch.zeros(align(comps[0]), dtype=torch.uint8)
    view = view_at(backing, entries[0].rel_byte, entries[0].meta)
    with pytest.raises(RuntimeError, match="more than one element"):
        view.copy_((x[:1] + 3.0).expand_as(x))  # what the copy mode used to do
    packer = ArenaPacker("expanded", entries, [view], set(), [x])
    with torch.autograd.graph.saved_tensors_hooks(packer.pack, packer.unpack):
        y = ExpandedSave.apply(x)
    packer.finish()
    assert packer.copies == 1
    (gx,) = torch.autograd.grad(y.sum(), [x])
    assert torch.equal(gx, (x[:1] + 3.0).expand_as(x).detach())
    dst = view_at(torch.zeros(64, dtype=torch.uint8), 0, TensorMeta((4, 2), (0, 1), torch.float32))
    copy_view(torch.tensor([[1.0, 2.0]]).expand(4, 2), dst)
    assert dst.tolist() == [[1.0, 2.0]] * 4


# ----------------------------------------------------------------------------- process state


class _FakeCuda:
    """``torch.cuda``'s RNG and stream calls, on host state."""

    def __init__(self) -> None:
        self.rng = torch.tensor([1, 2, 3], dtype=torch.uint8)
        self.stream = "default"

    def get_rng_state(self, device: Any) -> torch.Tensor:
        return self.rng.clone()

    def set_rng_state(self, state: torch.Tensor, device: Any) -> None:
        self.rng = state.clone()

    def current_stream(self, device: Any) -> str:
        return self.stream

    def set_stream(self, stream: str) -> None:
        self.stream = stream


def test_a_failed_capture_leaves_rng_stream_hooks_and_modes_as_it_found_them() -> None:
    cuda = _FakeCuda()
    modes = len(_get_current_dispatch_mode_stack())
    with pytest.raises(ValueError, match="boom") as info:
        with ProcessStateGuard("cuda:0", cuda) as guard:
            cuda.rng = torch.tensor([9, 9, 9], dtype=torch.uint8)  # warmup/capture consumed random numbers
            cuda.stream = "capture side stream"  # torch.cuda.graph's __exit__ raised before restoring it
            torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t).__enter__()  # never exited
            TorchDispatchMode().__enter__()  # never exited
            torch.set_grad_enabled(False)
            raise ValueError("boom")
    assert cuda.rng.tolist() == [1, 2, 3] and cuda.stream == "default"
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert len(_get_current_dispatch_mode_stack()) == modes
    assert torch.is_grad_enabled()
    assert sorted(guard.removed) == ["current stream", "dispatch mode TorchDispatchMode", "saved-tensor hooks"]
    del info


def test_a_successful_capture_keeps_the_rng_it_was_given_but_drops_leaks() -> None:
    cuda = _FakeCuda()
    with ProcessStateGuard("cuda:0", cuda) as guard:
        cuda.rng = torch.tensor([7, 7, 7], dtype=torch.uint8)
        TorchDispatchMode().__enter__()
    assert cuda.rng.tolist() == [7, 7, 7]  # only warmup's use is undone, by restore_rng (see capture)
    assert guard.removed == ["dispatch mode TorchDispatchMode"]
    with ProcessStateGuard("cuda:0", cuda) as guard:
        cuda.rng = torch.tensor([5, 5, 5], dtype=torch.uint8)
        guard.restore_rng()
    assert cuda.rng.tolist() == [7, 7, 7]


# ----------------------------------------------------------------------------- phases


def test_phases_move_only_forward_and_fail_from_anywhere() -> None:
    st = PhaseState()
    for p in (Phase.WARMUP, Phase.LAYOUT, Phase.CAPTURE, Phase.REPLAY, Phase.CLOSED):
        st.advance(p)
    assert st.history[-1] is Phase.CLOSED
    with pytest.raises(PhaseError, match="cannot go from phase closed"):
        st.advance(Phase.REPLAY)
    st2 = PhaseState()
    with pytest.raises(PhaseError, match="cannot go from phase prepare to capture"):
        st2.advance(Phase.CAPTURE)
    st2.advance(Phase.WARMUP)
    with pytest.raises(PhaseError, match="capture needs phase layout"):
        st2.require(Phase.LAYOUT, what="capture")
    st2.fail()
    st2.fail()
    assert st2.phase is Phase.FAILED and st2.history == [Phase.PREPARE, Phase.WARMUP, Phase.FAILED]
    with pytest.raises(PhaseError):
        PhaseState(Phase.REPLAY).advance(Phase.FAILED)


def test_no_session_attribute_is_created_outside_init() -> None:
    import ast
    import inspect

    src = inspect.getsource(capture_mod._Session)
    tree = ast.parse(src)
    init = {t.attr for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__"
            for t in ast.walk(n) if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id == "self" and isinstance(t.ctx, ast.Store)}
    later = {t.attr for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name != "__init__"
             for t in ast.walk(n) if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
             and t.value.id == "self" and isinstance(t.ctx, ast.Store)}
    assert later <= init, later - init


# ----------------------------------------------------------------------------- the rewind


class _FakeSession:
    """What ``_Session._rewind`` reads, with the pool's live set on the host."""

    def __init__(self, live: set[int], checkpoint_live: set[int]) -> None:
        self.checkpoint = alloc.Checkpoint(0, (0, 1), "state", frozenset(checkpoint_live))
        self.pool = SimpleNamespace(id=(0, 1))
        self.live = live
        self.logs: list[str] = []
        self.log = self.logs.append
        self.restores = 0
        self.detached = 0


def _patch_pool(monkeypatch: pytest.MonkeyPatch, session: _FakeSession, owners: list[Any]) -> list[Any]:
    calls: list[Any] = []
    monkeypatch.setattr(alloc, "quiesce", lambda: None)
    monkeypatch.setattr(alloc, "live_ptrs", lambda pool_id: frozenset(session.live))
    monkeypatch.setattr(alloc, "pool_blocks", lambda pool_id: [])
    monkeypatch.setattr(alloc, "verify_live", lambda cp: calls.append(("verify", cp.live)))
    monkeypatch.setattr(alloc, "restore", lambda cp, stale: calls.append(("restore", [s.data_ptr() for s in stale])))
    monkeypatch.setattr(capture_mod, "_owner_candidates", lambda module, outs: owners)
    monkeypatch.setattr(alloc, "has_standard_deleter", lambda s: getattr(s, "owns", True))
    return calls


def _owner(ptr: int, owns: bool = True) -> Any:
    return SimpleNamespace(data_ptr=lambda: ptr, owns=owns)


def test_the_rewind_restores_only_when_a_capture_left_stale_owners(monkeypatch: pytest.MonkeyPatch) -> None:
    same = _FakeSession({0x100}, {0x100})
    calls = _patch_pool(monkeypatch, same, [_owner(0x900)])
    capture_mod._Session._rewind(same, None, (), "fwd")  # type: ignore[arg-type]
    assert calls == [("verify", frozenset({0x100}))] and same.restores == 0  # provably the checkpoint state

    stale = _FakeSession({0x100, 0x200}, {0x100})
    calls = _patch_pool(monkeypatch, stale, [_owner(0x200), _owner(0x900)])
    capture_mod._Session._rewind(stale, None, (), "fwd")  # type: ignore[arg-type]
    assert calls == [("restore", [0x200])] and stale.restores == 1 and stale.detached == 1

    orphan = _FakeSession({0x100, 0x300}, {0x100})
    _patch_pool(monkeypatch, orphan, [_owner(0x200), _owner(0x300, owns=False)])  # 0x300: an alias detached earlier
    with pytest.raises(alloc.PoolStateError, match="no known stale owner"):
        capture_mod._Session._rewind(orphan, None, (), "fwd")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- restore and rollback


class _Store:
    """A storage as the allocator binding sees it: its pointer and who frees it."""

    def __init__(self, ptr: int, deleter: str | None) -> None:
        self.ptr = ptr
        self.deleter = deleter  # "std" (frees the block), "nothing" (stripped), None (never had one)
        self._cdata = id(self)

    def data_ptr(self) -> int:
        return self.ptr


class _Binding:
    """``_cuda_setCheckpointPoolState`` on host state: restoring strips the stale storages'
    deleters; a storage without deleter passed to re-own gets the re-created block."""

    def __init__(self, storages: dict[int, _Store], live: set[int]) -> None:
        self.storages = storages
        self.live = set(live)
        self.calls = 0
        self.fail: str | None = None  # "before" or "after": the first call fails there

    def __call__(self, device: int, state: Any, stale: list[int], add: list[int]) -> None:
        self.calls += 1
        if self.fail == "before" and self.calls == 1:
            raise RuntimeError("injected restore failure")
        self.live = set(state)
        for c in stale:
            assert self.storages[c].deleter == "std"
            self.storages[c].deleter = "nothing"
        for c in add:
            assert self.storages[c].deleter is None, "only storages without deleter can be re-owned"
            self.storages[c].deleter = "std"
        if self.fail == "after" and self.calls == 1:
            raise RuntimeError("injected restore failure")


@pytest.mark.parametrize("timing", ["detach", "before", "after", "verify"])
def test_a_failed_restore_rolls_back_and_stale_owners_own_again(monkeypatch: pytest.MonkeyPatch, timing: str) -> None:
    kept = frozenset({0x100})
    stale = [_Store(0x200, "std"), _Store(0x300, "std")]
    storages = {s._cdata: s for s in stale}
    binding = _Binding(storages, kept | {0x200, 0x300})
    binding.fail = timing if timing in ("before", "after") else None
    target = alloc.Checkpoint(0, (0, 1), frozenset(kept), kept)

    def stand_in(s: _Store) -> _Store:
        n = _Store(s.ptr, None)
        storages[n._cdata] = n
        return n

    swaps = {"n": 0}

    def swap(a: _Store, b: _Store) -> None:
        a.deleter, b.deleter = b.deleter, a.deleter
        swaps["n"] += 1
        if timing == "detach" and swaps["n"] == 2:
            raise RuntimeError("injected detach failure")  # after swapping the second owner

    verifies = {"n": 0}

    def verify(cp: alloc.Checkpoint) -> None:
        verifies["n"] += 1
        if timing == "verify" and verifies["n"] == 1:
            raise alloc.PoolStateError("injected verification failure")

    monkeypatch.setattr(alloc, "checkpoint", lambda pool, dev: alloc.Checkpoint(
        0, pool, frozenset(binding.live), frozenset(binding.live)))
    monkeypatch.setattr(alloc, "reversible_detach", lambda: True)
    monkeypatch.setattr(alloc, "has_standard_deleter", lambda s: s.deleter == "std")
    monkeypatch.setattr(alloc, "stand_in", stand_in)
    monkeypatch.setattr(alloc, "swap_owner", swap)
    monkeypatch.setattr(alloc, "verify_live", verify)
    monkeypatch.setattr(alloc, "check_live", lambda dev, pool, ptrs: set(ptrs) == binding.live)
    monkeypatch.setattr(torch._C, "_cuda_setCheckpointPoolState", binding, raising=False)
    with pytest.raises(alloc.PoolStateError, match="rolled back, every stale owner owns its block again"):
        alloc.restore(target, stale)  # type: ignore[arg-type]
    assert [s.deleter for s in stale] == ["std", "std"]
    assert binding.live == kept | {0x200, 0x300}
    # and the same restore without a fault detaches both owners
    binding.fail = None
    swaps["n"] = verifies["n"] = 10
    timing = "none"
    alloc.restore(target, stale)  # type: ignore[arg-type]
    assert [s.deleter for s in stale] == [None, None] and binding.live == kept


def test_a_stale_storage_that_owns_nothing_new_is_refused_before_anything_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alloc, "checkpoint", lambda pool, dev: alloc.Checkpoint(0, pool, "now", frozenset({1, 2})))
    monkeypatch.setattr(alloc, "has_standard_deleter", lambda s: True)
    with pytest.raises(alloc.PoolStateError, match="nothing was changed"):
        alloc.restore(alloc.Checkpoint(0, (0, 1), "cp", frozenset({1})), [_Store(7, "std")])  # type: ignore[list-item]


def test_restore_without_swap_support_still_rolls_back_intact_owners(monkeypatch: pytest.MonkeyPatch) -> None:
    stale = [_Store(0x200, "std")]
    binding = _Binding({s._cdata: s for s in stale}, {0x100, 0x200})
    binding.fail = "before"
    monkeypatch.setattr(alloc, "checkpoint", lambda pool, dev: alloc.Checkpoint(
        0, pool, frozenset(binding.live), frozenset(binding.live)))
    monkeypatch.setattr(alloc, "reversible_detach", lambda: False)
    monkeypatch.setattr(alloc, "has_standard_deleter", lambda s: s.deleter == "std")
    monkeypatch.setattr(torch._C, "_cuda_setCheckpointPoolState", binding, raising=False)
    with pytest.raises(alloc.PoolStateError, match="rolled back"):
        alloc.restore(alloc.Checkpoint(0, (0, 1), frozenset({0x100}), frozenset({0x100})), stale)  # type: ignore[arg-type]
    assert stale[0].deleter == "std" and binding.live == {0x100, 0x200}


def test_align_constant_is_what_the_layout_tests_assume() -> None:
    assert ALIGN == 256 and group_storage([], []).components == ()
