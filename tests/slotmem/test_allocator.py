"""The allocator adapter: feature detection, the capture guard, and (GPU) the checkpoint facts we rely on."""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harness.slotmem import allocator as alloc

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class FakeC:
    """A stand-in for torch._C with every required API and settable allocator settings."""

    def __init__(self, settings: str = "", backend: str = "native", can_set: bool = True) -> None:
        self.settings = settings
        self.calls: list[str] = []
        for name in alloc.REQUIRED_APIS:
            setattr(self, name, lambda *a, **k: None)
        self._cuda_getAllocatorBackend = lambda: backend
        if can_set:
            self._accelerator_setAllocatorSettings = self._set

    def _accelerator_getAllocatorSettings(self) -> str:
        return self.settings

    def _set(self, text: str) -> None:
        self.calls.append(text)
        merged = alloc.parse_settings(self.settings)
        merged.update(alloc.parse_settings(text))
        self.settings = ",".join(f"{k}:{v}" for k, v in merged.items())


def test_parse_settings() -> None:
    assert alloc.parse_settings("expandable_segments:True, max_split_size_mb:64") == {
        "expandable_segments": "True",
        "max_split_size_mb": "64",
    }
    assert alloc.parse_settings("") == {}


def test_missing_apis_lists_every_absent_name() -> None:
    assert alloc.missing_apis(SimpleNamespace()) == list(alloc.REQUIRED_APIS)
    assert alloc.missing_apis(FakeC()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_require_support_fails_closed_without_cuda() -> None:
    with pytest.raises(alloc.AllocatorUnsupported, match="needs a CUDA device"):
        alloc.require_support()
    gc_before = gc.isenabled()
    with pytest.raises(alloc.AllocatorUnsupported):
        with alloc.CaptureGuard():
            pass
    assert gc.isenabled() == gc_before


def test_guard_switches_expandable_segments_off_and_restores() -> None:
    fake = FakeC("expandable_segments:True")
    gc.enable()
    with alloc.CaptureGuard(fake, check_support=False):
        assert not gc.isenabled()
        assert not alloc.expandable_segments_on(fake)
    assert gc.isenabled()
    assert alloc.expandable_segments_on(fake)
    assert fake.calls == ["expandable_segments:False", "expandable_segments:True"]


def test_guard_restores_on_error_inside() -> None:
    fake = FakeC("expandable_segments:True")
    gc.enable()
    with pytest.raises(ZeroDivisionError):
        with alloc.CaptureGuard(fake, check_support=False):
            1 / 0
    assert gc.isenabled() and alloc.expandable_segments_on(fake)


def test_guard_leaves_settings_alone_when_expandable_is_off() -> None:
    fake = FakeC("max_split_size_mb:0")
    with alloc.CaptureGuard(fake, check_support=False):
        pass
    assert fake.calls == []


def test_guard_refuses_when_expandable_cannot_be_switched_off() -> None:
    fake = FakeC("expandable_segments:True", can_set=False)
    gc.enable()
    with pytest.raises(alloc.AllocatorUnsupported, match="expandable_segments"):
        with alloc.CaptureGuard(fake, check_support=False):
            pass
    assert gc.isenabled()


@pytest.mark.cuda
@cuda
def test_guard_refuses_non_native_backend() -> None:
    with pytest.raises(alloc.AllocatorUnsupported, match="cudaMallocAsync"):
        alloc.require_support(FakeC(backend="cudaMallocAsync"))


def test_pool_inspection_reads_only_the_pools_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """pool_blocks / live_ptrs / pool_bytes / require_fixed_segments on a fake allocator snapshot."""
    def seg(pool: tuple[int, int], address: int, sizes_states: list[tuple[int, str]], expandable: bool = False):
        total = sum(n for n, _ in sizes_states)
        used = sum(n for n, st in sizes_states if st == "active_allocated")
        return {"segment_pool_id": pool, "address": address, "total_size": total, "allocated_size": used,
                "is_expandable": expandable, "blocks": [{"size": n, "state": st} for n, st in sizes_states]}

    mine, other = (1, 7), (1, 8)
    snapshot = [
        seg(mine, 0x1000, [(512, "active_allocated"), (256, "inactive"), (256, "active_allocated")]),
        seg(other, 0x9000, [(4096, "active_allocated")], expandable=True),
        {"address": 0x20000, "total_size": 64, "allocated_size": 64, "blocks": [{"size": 64, "state": "active_allocated"}]},
    ]
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *a, **k: snapshot)
    assert alloc.pool_blocks(mine) == [alloc.Block(0x1000, 512, True), alloc.Block(0x1200, 256, False),
                                       alloc.Block(0x1300, 256, True)]
    assert alloc.live_ptrs(mine) == {0x1000, 0x1300}
    assert alloc.pool_bytes(mine) == alloc.PoolBytes(1024, 768)
    alloc.require_fixed_segments(mine)  # the expandable segment belongs to another pool
    with pytest.raises(alloc.AllocatorUnsupported, match="expandable"):
        alloc.require_fixed_segments(other)


# ----------------------------------------------------------------------------- GPU facts


def _pool_tensor(pool: Any, n: int) -> torch.Tensor:
    with torch.cuda.use_mem_pool(pool):
        return torch.empty(n, dtype=torch.uint8, device="cuda")


@pytest.mark.cuda
@cuda
def test_fact_checkpoint_of_fresh_mempool_and_live_set() -> None:
    pool = torch.cuda.MemPool()
    empty = alloc.checkpoint(pool.id)
    assert empty.live == frozenset()
    a = _pool_tensor(pool, 1 << 20)
    cp = alloc.checkpoint(pool.id)
    assert cp.live == {a.data_ptr()}
    assert alloc.check_live(cp.device, pool.id, {a.data_ptr()})
    assert not alloc.check_live(cp.device, pool.id, set())
    assert alloc.has_standard_deleter(a.untyped_storage())


@pytest.mark.cuda
@cuda
def test_fact_restore_strips_stale_owner_and_reuses_address() -> None:
    pool = torch.cuda.MemPool()
    keep = _pool_tensor(pool, 1 << 20)
    cp = alloc.checkpoint(pool.id)
    stale = _pool_tensor(pool, 1 << 16)
    stale_ptr = stale.data_ptr()
    with pytest.raises(alloc.PoolStateError, match="rolled back"):
        alloc.restore(cp, [])  # a live owner not passed as stale: the binding refuses, we roll back
    assert alloc.live_ptrs(pool.id) == {keep.data_ptr(), stale_ptr}
    assert alloc.has_standard_deleter(stale.untyped_storage())
    alloc.restore(cp, [stale.untyped_storage()])
    assert not alloc.has_standard_deleter(stale.untyped_storage())
    assert alloc.live_ptrs(pool.id) == {keep.data_ptr()}
    again = _pool_tensor(pool, 1 << 16)
    assert again.data_ptr() == stale_ptr  # identical state -> identical placement
    del stale  # its deleter is gone: must not free `again`'s block
    alloc.quiesce()
    assert again.data_ptr() in alloc.live_ptrs(pool.id)


@pytest.mark.cuda
@cuda
def test_fact_verify_live_catches_a_skipped_restore() -> None:
    pool = torch.cuda.MemPool()
    cp = alloc.checkpoint(pool.id)
    extra = _pool_tensor(pool, 4096)
    with pytest.raises(alloc.PoolStateError, match="1 unexpected"):
        alloc.verify_live(cp)
    del extra


@pytest.mark.cuda
@cuda
def test_fact_fill_free_blocks_poisons_only_free_memory() -> None:
    pool = torch.cuda.MemPool()
    a = _pool_tensor(pool, 1 << 20)
    b = _pool_tensor(pool, 1 << 20)
    a.fill_(1)
    del b
    n = alloc.fill_free_blocks(pool.id, 0xFF)
    assert n > 0
    torch.cuda.synchronize()
    assert bool((a == 1).all())
    c = _pool_tensor(pool, 1 << 20)
    assert bool((c == 0xFF).all())
    assert alloc.pool_bytes(pool.id).reserved >= 2 << 20


@pytest.mark.cuda
@cuda
def test_fact_api_names_present() -> None:
    assert alloc.missing_apis() == []
    assert torch._C._cuda_getAllocatorBackend() == "native"


@pytest.mark.cuda
@cuda
def test_fact_runtime_expandable_segments_are_refused_on_the_pool() -> None:
    torch._C._accelerator_setAllocatorSettings("expandable_segments:True")
    try:
        pool = torch.cuda.MemPool()
        t = _pool_tensor(pool, 4 << 20)
        with pytest.raises(alloc.AllocatorUnsupported, match="expandable"):
            alloc.require_fixed_segments(pool.id)
        del t
    finally:
        torch._C._accelerator_setAllocatorSettings("expandable_segments:False")
    pool2 = torch.cuda.MemPool()
    t2 = _pool_tensor(pool2, 4 << 20)
    alloc.require_fixed_segments(pool2.id)
    del t2
