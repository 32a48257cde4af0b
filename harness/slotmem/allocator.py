"""The only module that touches PyTorch's private caching-allocator APIs (``torch._C``).

Everything here is feature-detected: a missing API, a non-native allocator backend or an allocator
setting that cannot be switched off raises :class:`AllocatorUnsupported` before anything is captured.
Process-wide state changed for a capture (garbage collector, ``expandable_segments``) is restored on
exit, also when the capture fails.

Facts relied on (checked on an H200 with torch 2.11, see bench/RESULTS-log.md):
* ``_cuda_getCheckpointState(device, pool_id)`` snapshots a live pool's block layout;
* ``_cuda_setCheckpointPoolState(device, state, stale_storages, storages_to_add_deleters_to)`` rewinds
  it, stripping the deleters of the given stale storages;
* ``_cuda_checkPoolLiveAllocations(device, pool_id, ptrs)`` is True iff the pool's allocated blocks
  are exactly ``ptrs``.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Iterable, Sequence

import torch

REQUIRED_APIS: tuple[str, ...] = (
    "_cuda_getCheckpointState",
    "_cuda_setCheckpointPoolState",
    "_cuda_checkPoolLiveAllocations",
    "_cuda_getAllocatorBackend",
    "_cuda_clearCublasWorkspaces",
    "_has_Standard_Deleter",
    "_construct_storage_from_data_pointer",
)  # optional: UntypedStorage._swap_data_ptr_ (reversible detach, see restore)
_SETTINGS_GET = "_accelerator_getAllocatorSettings"
_SETTINGS_SET = "_accelerator_setAllocatorSettings"


class AllocatorUnsupported(RuntimeError):
    """The running PyTorch cannot do slot-shared capture (missing API, wrong backend, settings)."""


class PoolStateError(RuntimeError):
    """The pool is not in the state the capture plan requires (leak, stale owner, failed restore)."""


def missing_apis(namespace: Any = None) -> list[str]:
    """Names of the required private APIs that ``namespace`` (default ``torch._C``) lacks."""
    ns = torch._C if namespace is None else namespace
    return [name for name in REQUIRED_APIS if not hasattr(ns, name)]


def require_support(namespace: Any = None) -> None:
    """Raise :class:`AllocatorUnsupported` unless slot-shared capture can run in this process."""
    ns = torch._C if namespace is None else namespace
    if not torch.cuda.is_available():
        raise AllocatorUnsupported(
            "slot-shared CUDA graph capture needs a CUDA device, and torch.cuda.is_available() is False; "
            "run on a GPU machine or use eager execution"
        )
    missing = missing_apis(ns)
    if missing:
        raise AllocatorUnsupported(
            f"torch {torch.__version__} lacks the private allocator APIs {missing}; slot-shared capture "
            "needs torch 2.11+ built with CUDA (use ordinary capture or another torch build)"
        )
    backend = ns._cuda_getAllocatorBackend()
    if backend != "native":
        raise AllocatorUnsupported(
            f"the CUDA allocator backend is {backend!r}; checkpoint/restore needs the native caching "
            "allocator: remove 'backend:cudaMallocAsync' from PYTORCH_CUDA_ALLOC_CONF/PYTORCH_ALLOC_CONF"
        )


def _settings_string(ns: Any) -> str:
    if hasattr(ns, _SETTINGS_GET):
        return str(getattr(ns, _SETTINGS_GET)())
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")


def parse_settings(text: str) -> dict[str, str]:
    """``'a:1,b:True'`` -> ``{'a': '1', 'b': 'True'}`` (allocator config syntax)."""
    out: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, _, value = part.partition(":")
        out[key.strip()] = value.strip()
    return out


def expandable_segments_on(namespace: Any = None) -> bool:
    ns = torch._C if namespace is None else namespace
    return parse_settings(_settings_string(ns)).get("expandable_segments", "False").lower() == "true"


class CaptureGuard:
    """Process state for one capture session: GC off, expandable segments off, both restored.

    ``namespace`` is ``torch._C`` in production; tests pass a fake to check the restore logic.
    """

    def __init__(self, namespace: Any = None, *, check_support: bool = True) -> None:
        self._ns = torch._C if namespace is None else namespace
        self._check = check_support
        self._gc_was_enabled = False
        self._restore_expandable = False

    def __enter__(self) -> "CaptureGuard":
        if self._check:
            require_support(self._ns)
        self._gc_was_enabled = gc.isenabled()
        try:
            if expandable_segments_on(self._ns):
                if not hasattr(self._ns, _SETTINGS_SET):
                    raise AllocatorUnsupported(
                        "expandable_segments:True is set and this torch cannot switch it off at run time; "
                        "unset it in PYTORCH_CUDA_ALLOC_CONF for graph capture"
                    )
                getattr(self._ns, _SETTINGS_SET)("expandable_segments:False")
                self._restore_expandable = True
                if expandable_segments_on(self._ns):
                    raise AllocatorUnsupported(
                        "could not switch expandable_segments off for capture; unset it in "
                        "PYTORCH_CUDA_ALLOC_CONF"
                    )
            gc.collect()
            gc.disable()
        except BaseException:
            self._restore()
            raise
        return self

    def _restore(self) -> None:
        if self._restore_expandable:
            getattr(self._ns, _SETTINGS_SET)("expandable_segments:True")
            self._restore_expandable = False
        if self._gc_was_enabled:
            gc.enable()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._restore()


# ---------------------------------------------------------------------------------------------
# Pool inspection and checkpoints


def _device_index(device: torch.device | int | None) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    return device.index if device.index is not None else torch.cuda.current_device()


def quiesce() -> None:
    """Finish all work and flush the allocator's deferred frees/events (never during a capture)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def clear_cublas_workspaces(device: torch.device | int | None = None) -> None:
    """Drop cached cuBLAS/cuBLASLt workspaces, on this thread and on the autograd engine's thread.

    A capture must allocate its workspace inside its own pool (and free it afterwards), never use
    one cached in the default pool. The autograd engine runs CUDA backward ops on a per-device
    worker thread whose workspaces are not cleared from the main thread; a one-element backward
    with a hook runs the clear on that thread. Never call this during a capture.
    """
    torch._C._cuda_clearCublasWorkspaces()
    dev = torch.device("cuda", _device_index(device))
    leaf = torch.zeros((), device=dev, requires_grad=True)

    def clear_on_engine_thread(grad: torch.Tensor) -> torch.Tensor:
        torch._C._cuda_clearCublasWorkspaces()
        return grad

    leaf.register_hook(clear_on_engine_thread)
    (leaf * 1.0).backward()


@dataclass(frozen=True)
class Block:
    ptr: int
    size: int
    allocated: bool


def _pool_segments(pool_id: tuple[int, int]) -> list[dict[str, Any]]:
    """The allocator snapshot's segments that belong to the pool ``pool_id``."""
    return [seg for seg in torch.cuda.memory_snapshot(pool_id)
            if tuple(seg.get("segment_pool_id", (0, 0))) == tuple(pool_id)]


def pool_blocks(pool_id: tuple[int, int]) -> list[Block]:
    """Every block of the pool's segments, in address order within each segment."""
    blocks: list[Block] = []
    for seg in _pool_segments(pool_id):
        addr = int(seg["address"])
        for b in seg["blocks"]:
            size = int(b["size"])
            blocks.append(Block(addr, size, b["state"] == "active_allocated"))
            addr += size
    return blocks


def require_fixed_segments(pool_id: tuple[int, int]) -> None:
    """Fail closed if any segment of the pool is expandable (restores would not be exact).

    Torch 2.11 has no getter for allocator settings, so a run-time ``expandable_segments:True``
    set without the environment variable is only visible here, on the pool's segments."""
    for seg in _pool_segments(pool_id):
        if seg.get("is_expandable", False):
            raise AllocatorUnsupported(
                "the capture pool got expandable segments (expandable_segments:True was set at run time); "
                "switch it off (torch._C._accelerator_setAllocatorSettings('expandable_segments:False') or "
                "PYTORCH_CUDA_ALLOC_CONF) for slot-shared capture"
            )


def live_ptrs(pool_id: tuple[int, int]) -> frozenset[int]:
    return frozenset(b.ptr for b in pool_blocks(pool_id) if b.allocated)


@dataclass(frozen=True)
class PoolBytes:
    reserved: int
    allocated: int


def pool_bytes(pool_id: tuple[int, int]) -> PoolBytes:
    reserved = allocated = 0
    for seg in _pool_segments(pool_id):
        reserved += int(seg["total_size"])
        allocated += int(seg["allocated_size"])
    return PoolBytes(reserved, allocated)


def check_live(device: int, pool_id: tuple[int, int], ptrs: Iterable[int]) -> bool:
    return bool(torch._C._cuda_checkPoolLiveAllocations(device, pool_id, set(ptrs)))


def has_standard_deleter(storage: torch.UntypedStorage) -> bool:
    return bool(torch._C._has_Standard_Deleter(storage._cdata))


@dataclass(frozen=True)
class Checkpoint:
    """A pool's allocator state plus the set of block pointers allocated in it."""

    device: int
    pool_id: tuple[int, int]
    state: Any
    live: frozenset[int]


def checkpoint(pool_id: tuple[int, int], device: torch.device | int | None = None) -> Checkpoint:
    quiesce()
    dev = _device_index(device)
    state = torch._C._cuda_getCheckpointState(dev, pool_id)
    return Checkpoint(dev, tuple(pool_id), state, live_ptrs(pool_id))  # type: ignore[arg-type]


def reversible_detach() -> bool:
    """Whether this torch can swap a storage's data pointer (``UntypedStorage._swap_data_ptr_``),
    which makes detaching a stale owner reversible (see :func:`restore`)."""
    return hasattr(torch.UntypedStorage, "_swap_data_ptr_")


def stand_in(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A non-owning storage at ``storage``'s bytes (no deleter)."""
    return torch._C._construct_storage_from_data_pointer(storage.data_ptr(), storage.device, storage.nbytes())


def swap_owner(a: torch.UntypedStorage, b: torch.UntypedStorage) -> None:
    """Exchange the data pointers (and so the ownership) of two storages of the same bytes."""
    a._swap_data_ptr_(b)


def _check_stale(before: Checkpoint, cp: Checkpoint, stale: Sequence[torch.UntypedStorage]) -> None:
    """Every stale storage must own (standard deleter) a block allocated after ``cp``; checked
    before anything changes, so that a refusal leaves the pool and every owner as they were."""
    for s in stale:
        if s.data_ptr() not in before.live - cp.live or not has_standard_deleter(s):
            raise PoolStateError(
                f"stale storage at {s.data_ptr():#x} does not own a pool block allocated since the checkpoint; "
                "only storages that own such blocks can be detached (nothing was changed)"
            )


def restore(cp: Checkpoint, stale: Sequence[torch.UntypedStorage]) -> None:
    """Rewind the pool to ``cp`` as a transaction.

    ``stale`` are storages that own blocks allocated after ``cp``; afterwards they are non-owning
    aliases of those bytes (their death frees nothing). If the restore or its verification fails,
    the pool is rolled back to the state just before this call, every stale storage owns its block
    again (a later death frees it, exactly once) and :class:`PoolStateError` is raised.

    With :func:`reversible_detach` each stale storage gives its owning data pointer to a stand-in
    (:func:`stand_in`, :func:`swap_owner`); the allocator strips the stand-ins' deleters. Rollback
    swaps back what a stand-in still owns and lets the rollback re-own the rest (a storage without
    deleter may take a re-created block's new owning pointer). Without it the allocator strips the
    stale storages themselves, which cannot be undone: a failure after that raises a
    :class:`PoolStateError` that says the pool is poisoned.
    """
    before = checkpoint(cp.pool_id, cp.device)
    _check_stale(before, cp, stale)
    if not reversible_detach():
        _restore_irreversibly(before, cp, stale)
        return
    pairs: list[tuple[torch.UntypedStorage, torch.UntypedStorage]] = []
    try:
        for s in stale:
            pairs.append((s, stand_in(s)))
            swap_owner(*pairs[-1])
        torch._C._cuda_setCheckpointPoolState(cp.device, cp.state, [n._cdata for _, n in pairs], [])
        _verify_detached(cp, [s for s, _ in pairs] + [n for _, n in pairs])
    except Exception as err:
        _roll_back(before, pairs, err)
        raise PoolStateError(
            f"pool restore failed and was rolled back, every stale owner owns its block again: {err}"
        ) from err


def _verify_detached(cp: Checkpoint, storages: Sequence[torch.UntypedStorage]) -> None:
    for s in storages:
        if has_standard_deleter(s):
            raise PoolStateError(
                f"storage at {s.data_ptr():#x} still owns its block after the restore; it would free memory "
                "that later graphs use"
            )
    verify_live(cp)


def _roll_back(before: Checkpoint, pairs: Sequence[tuple[torch.UntypedStorage, torch.UntypedStorage]],
               err: BaseException) -> None:
    """Back to ``before``: each stale storage ``s`` owns its block again, from its stand-in ``n``
    when ``n`` still owns it, else from the block the rollback re-creates."""
    reown = []
    try:
        for s, n in pairs:
            if has_standard_deleter(s):
                continue  # never detached
            if has_standard_deleter(n):
                swap_owner(s, n)
            else:
                reown.append(s)  # its stand-in was stripped: s (no deleter) takes the re-created block
        torch._C._cuda_setCheckpointPoolState(before.device, before.state, [], [s._cdata for s in reown])
        lost = [s for s, _ in pairs if not has_standard_deleter(s)]
        if lost or not check_live(before.device, before.pool_id, before.live):
            raise PoolStateError(f"{len(lost)} stale owner(s) did not get their blocks back, or the live set "
                                 "differs from the state before the restore")
    except Exception as err2:
        raise PoolStateError(
            f"pool restore failed ({err}) and so did the rollback ({err2}); the pool is poisoned: drop every "
            "graph captured into it and start a new process"
        ) from err


def _restore_irreversibly(before: Checkpoint, cp: Checkpoint, stale: Sequence[torch.UntypedStorage]) -> None:
    """:func:`restore` on a torch without ``_swap_data_ptr_``: the allocator strips the stale
    storages' deleters itself. A failure before that is rolled back with every owner intact; a
    failure after it leaves the stale storages non-owning (their blocks stay allocated)."""
    try:
        torch._C._cuda_setCheckpointPoolState(cp.device, cp.state, [s._cdata for s in stale], [])
    except RuntimeError as err:
        stripped = [s for s in stale if not has_standard_deleter(s)]
        try:
            torch._C._cuda_setCheckpointPoolState(before.device, before.state, [], [])
        except RuntimeError as err2:  # pragma: no cover - needs a torch bug to reach
            raise PoolStateError(
                f"pool restore failed ({err}) and so did the rollback ({err2}); the pool is poisoned: "
                "drop every graph captured into it and start a new process"
            ) from err
        if stripped:
            raise PoolStateError(
                f"pool restore failed after detaching {len(stripped)} stale owner(s) and was rolled back, but this "
                f"torch cannot give them their blocks back (no UntypedStorage._swap_data_ptr_): {err}"
            ) from err
        raise PoolStateError(
            f"pool restore failed and was rolled back: {err}. Every storage that owns a block allocated "
            "since the checkpoint must be passed as stale"
        ) from err
    _verify_detached(cp, stale)


def verify_live(cp: Checkpoint) -> None:
    if not check_live(cp.device, cp.pool_id, cp.live):
        now = live_ptrs(cp.pool_id)
        extra = sorted(now - cp.live)
        missing = sorted(cp.live - now)
        raise PoolStateError(
            f"pool live set differs from its checkpoint: {len(extra)} unexpected block(s) "
            f"{[hex(p) for p in extra[:8]]}, {len(missing)} missing {[hex(p) for p in missing[:8]]}; "
            "a capture left memory allocated in the pool (restore skipped, or a stale owner kept it)"
        )


def fill_free_blocks(pool_id: tuple[int, int], byte_value: int, device: torch.device | int | None = None) -> int:
    """Fill every free block of the pool with ``byte_value`` (0xFF makes fp32/bf16 NaN).

    Returns the number of bytes written. Used to poison dead memory between replays so that a
    liveness bug shows up as NaN instead of hiding behind stale-but-correct bytes.
    """
    dev = torch.device("cuda", _device_index(device))
    written = 0
    for b in pool_blocks(pool_id):
        if b.allocated or b.size == 0:
            continue
        storage = torch._C._construct_storage_from_data_pointer(b.ptr, dev, b.size)
        t = torch.empty(0, dtype=torch.uint8, device=dev).set_(storage)
        t.fill_(byte_value)
        written += b.size
    return written


# ---------------------------------------------------------------------------------------------
# Allocation sites (what allocated each live block), for memory explanations


def record_allocation_sites(enabled: bool) -> None:
    """Keep (``True``) or stop keeping the Python stack of every live allocation, so the blocks of
    :func:`allocator_segments` carry ``frames`` (``torch.cuda.memory._record_memory_history`` in its
    cheapest mode: current allocations only, Python frames only, no event history)."""
    record = torch.cuda.memory._record_memory_history
    if enabled:
        record("state", context="state", stacks="python")
    else:
        record(None)


def allocator_segments() -> list[dict[str, Any]]:
    """Every segment of the caching allocator (all pools), as ``torch.cuda.memory_snapshot()``
    gives them: ``segment_pool_id``, ``total_size``, ``blocks`` (``size``, ``state``, ``frames``)."""
    return list(torch.cuda.memory_snapshot())
