"""What capture accepts as a tensor: plain tensors, wrapper subclasses and their physical storage.

Capture reasons about memory by storage (which bytes a tensor lives in). A *plain* tensor owns a
storage. A *wrapper subclass* (``torch.Tensor._make_wrapper_subclass``; Transformer Engine's FP8
parameters are such) has no valid storage of its own: its bytes live in the plain tensors it
holds (named by ``__tensor_flatten__`` when it implements the traceable-subclass protocol, else
found among its attributes). :func:`inner_tensors` finds them; :func:`storage_keys` names the
storages.

Graph inputs must be plain device tensors (:func:`check_inputs`): the graph replays fixed
addresses, so every input is copied into a static buffer before each replay.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_MAX_DEPTH = 4  # wrapper subclasses nested deeper than this are not searched


class WarmupError(RuntimeError):
    """The callable does something capture cannot handle, or behaves differently between warmups."""


def has_storage(t: torch.Tensor) -> bool:
    """True when ``t`` owns a real storage (plain tensors and plain-storage subclasses); False for
    wrapper subclasses, whose python storage is invalid."""
    if type(t) in _PLAIN:
        return True
    try:
        t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def inner_tensors(t: torch.Tensor, _depth: int = 0) -> list[torch.Tensor]:
    """The tensors with real storage that hold ``t``'s bytes: ``[t]`` for a tensor with storage,
    else the inner tensors of a wrapper subclass (recursively; ``[]`` when none can be found)."""
    if has_storage(t):
        return [t]
    if _depth >= _MAX_DEPTH:
        return []
    values: Iterable[Any]
    flatten = getattr(t, "__tensor_flatten__", None)
    names = None
    if callable(flatten):
        try:
            names = flatten()[0]
        except Exception:  # a subclass whose flatten needs more context: fall back to its attributes
            names = None
    values = [getattr(t, n, None) for n in names] if names is not None else list(vars(t).values())
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.extend(inner_tensors(v, _depth + 1))
    return out


def storage_key(t: torch.Tensor) -> int:
    """The key of the storage that holds a plain tensor's bytes: its data pointer; on the meta
    device (no bytes, every pointer 0) the identity of its storage object, which torch keeps
    while the storage lives (the planner of ``harness.memplan`` runs warmup on meta tensors)."""
    s = t.untyped_storage()
    return id(s) if t.device.type == "meta" else s.data_ptr()


def storage_keys(t: torch.Tensor) -> frozenset[int]:
    """Keys (:func:`storage_key`) of the storages that hold ``t``'s bytes (see :func:`inner_tensors`)."""
    return frozenset(storage_key(x) for x in inner_tensors(t))


def is_plain(t: object) -> bool:
    """A tensor whose type is exactly ``torch.Tensor`` or ``torch.nn.Parameter``."""
    return type(t) in _PLAIN


def check_inputs(args: object, where: str, require_cuda: bool = True) -> tuple[torch.Tensor, ...]:
    """``args`` as a tuple of plain (CUDA) tensors, or :class:`WarmupError` naming the argument."""
    if isinstance(args, torch.Tensor) or not isinstance(args, (tuple, list)):
        raise WarmupError(f"{where} must return a tuple of tensors (one per graph input), got {type(args).__name__}")
    for i, x in enumerate(args):
        if not isinstance(x, torch.Tensor):
            raise WarmupError(
                f"{where}: argument {i} is a {type(x).__name__} ({x!r:.40}), not a tensor. A graph input must be a "
                "device tensor: the graph replays fixed addresses, so each input is copied into a static buffer "
                "before every replay and a Python value would be frozen at its capture-time value. Pass metadata "
                "as an int/bool tensor with requires_grad=False, or bind constants into the callable"
            )
        if not is_plain(x):
            raise WarmupError(f"{where}: argument {i} is a tensor subclass ({type(x).__name__}); graph inputs must be "
                              "plain tensors (unwrap it, or pass its data tensors as separate inputs)")
        if require_cuda and not x.is_cuda:
            raise WarmupError(f"{where}: argument {i} is on {x.device}; graph inputs must be CUDA tensors")
    return tuple(args)


def external_storage_keys(tensors: Iterable[torch.Tensor]) -> set[int]:
    """Storage pointers behind ``tensors`` (parameters and buffers; wrapper subclasses resolved)."""
    out: set[int] = set()
    for t in tensors:
        out |= storage_keys(t)
    return out
