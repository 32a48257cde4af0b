"""Digests of the training state a resume must carry over: the optimizer's (every state tensor,
the step counts, the hyperparameters of each group) and the RNG's (torch's CPU generator and the
rank's CUDA generator).

Taken from the live objects, not from a checkpoint file: at the harness's stop (the end of step K,
before the checkpoint is written) and right after the resumed process restored the checkpoint. A
checkpoint that drops or garbles some of the state gives another digest after the load, whatever
the file holds (``compare.resume``'s ``optimizer_state`` and ``rng_state``).

A tensor is fingerprinted on its device (no copy of the whole state to the host): its bytes read
as integers, summed, and summed again weighted by position (both in int64, wrapping: exact and
independent of the summation order), with its dtype and shape; the fingerprints and everything
else go through SHA-256. Equal state gives equal digests on any device; a changed element, a
swapped pair of elements or a lost tensor changes them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

# Integer views by element size, for reading a tensor's bytes as numbers.
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK = 1 << 22  # elements per pass: bounds the int64 temporaries


def tensor_fingerprint(t: torch.Tensor) -> str:
    """``dtype shape sum weighted``: exact integer sums of the tensor's bytes (see the module)."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    ints = flat.view(_INT_OF_SIZE[flat.element_size()])
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    weighted = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, ints.numel(), _CHUNK):
        part = ints[start:start + _CHUNK].to(torch.int64)
        where = torch.arange(start + 1, start + 1 + part.numel(), dtype=torch.int64,
                             device=flat.device)
        total += part.sum()
        weighted += (part * where).sum()
    return f"{t.dtype} {tuple(t.shape)} {int(total)} {int(weighted)}"


def _feed(h: "hashlib._Hash", value: Any) -> None:
    if isinstance(value, torch.Tensor):
        h.update(tensor_fingerprint(value).encode())
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            h.update(f"<{key}>".encode())
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(f"[{len(value)}".encode())
        for item in value:
            _feed(h, item)
        h.update(b"]")
    else:
        h.update(repr(value).encode())


def optimizer_digest(opt: torch.optim.Optimizer) -> str:
    """SHA-256 (16 hex digits) of the optimizer's ``state_dict()``: per parameter its state
    tensors (``exp_avg``, ``exp_avg_sq``, ``step``) and each group's hyperparameters."""
    h = hashlib.sha256()
    _feed(h, opt.state_dict())
    return h.hexdigest()[:16]


def rng_digest(device: torch.device) -> str:
    """SHA-256 (16 hex digits) of torch's CPU generator state and, on a CUDA rank, its device's."""
    h = hashlib.sha256(bytes(torch.get_rng_state().tolist()))
    if device.type == "cuda":
        h.update(bytes(torch.cuda.get_rng_state(device).tolist()))
    return h.hexdigest()[:16]


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The generator states a checkpoint keeps (:func:`restore_rng`)."""
    out = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def restore_rng(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
