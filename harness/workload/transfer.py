"""Host tensors to the device in one copy: a microbatch's inputs and metadata as views of one buffer.

A copy from pageable host memory waits for the stream (the host stops until the GPU has caught
up), so a dozen small uploads per microbatch keep the host from running ahead of the GPU. Here
every tensor's bytes go into one pinned staging buffer (each at a 16-byte aligned offset), one
non-blocking copy moves it, and each result is a view of the device buffer with its tensor's
dtype and shape. The values are the same bits; the caching host allocator keeps the staging
buffer until the copy has run.
"""

from __future__ import annotations

from typing import Sequence

import torch

ALIGN = 16


def _offsets(tensors: Sequence[torch.Tensor]) -> tuple[list[int], int]:
    offs, n = [], 0
    for t in tensors:
        offs.append(n)
        n += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return offs, max(n, ALIGN)


def to_device(tensors: Sequence[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, ...]:
    """``tensors`` (host) on ``device``: one pinned staging buffer and one non-blocking copy on
    CUDA; on the CPU the tensors themselves (as ``Tensor.to`` gives them)."""
    if device.type != "cuda":
        return tuple(t.to(device) for t in tensors)
    for i, t in enumerate(tensors):
        if t.device.type != "cpu":
            raise ValueError(f"tensor {i} is on {t.device}; to_device uploads host tensors")
    offs, total = _offsets(tensors)
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    for t, off in zip(tensors, offs):
        flat = t.contiguous().reshape(-1)
        host[off:off + flat.numel() * flat.element_size()].copy_(flat.view(torch.uint8))
    dev = host.to(device, non_blocking=True)
    return tuple(dev[off:off + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
                 for t, off in zip(tensors, offs))
