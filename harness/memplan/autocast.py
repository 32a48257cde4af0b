"""The device's autocast on meta tensors (torch has no autocast for the meta device).

CUDA autocast runs the matrix products in the low-precision dtype and casts their floating
inputs with an autograd-visible copy (which the product then saves: the bf16 copy of a weight is
a native saved tensor of a graphed block). :class:`MetaAutocast` does the same above autograd for
the ops of PyTorch's CUDA "lower precision" autocast list that the workload calls (``linear``,
``matmul``, ``mm``, ``bmm``, ``addmm``, ``baddbmm``, SDPA), so what a forward saves on meta is what
it saves on the GPU. The workload's own explicit casts (``.float()``, ``.to(x.dtype)``) need
nothing. The planner checks this against the real autocast on CPU tensors (tests/memplan).

While entered it also sets CUDA's autocast state (enabled, ``dtype``), as the GPU's block runs
under it: code that asks ``torch.is_autocast_enabled("cuda")`` to pick the GPU's path (the static
MoE's bf16 grouped GEMMs, ``harness.workload.ep``) picks it on meta too. The state is a flag of
the thread and touches no meta op (CUDA's autocast dispatches only CUDA tensors); it is restored
on exit.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

LOWER_PRECISION = frozenset({F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__,
                             torch.mm, torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.addmm,
                             torch.baddbmm, F.scaled_dot_product_attention})


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
        return x.to(dtype)
    return x


class MetaAutocast(TorchFunctionMode):
    """Autocast to ``dtype`` for the lower-precision ops (see the module docstring)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self._saved: list[tuple[bool, torch.dtype]] = []

    def __enter__(self) -> "MetaAutocast":
        self._saved.append((torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")))
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", self.dtype)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            enabled, dtype = self._saved.pop()
            torch.set_autocast_enabled("cuda", enabled)
            torch.set_autocast_dtype("cuda", dtype)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in LOWER_PRECISION:
            args = tuple(_cast(a, self.dtype) for a in args)
            kwargs = {k: _cast(v, self.dtype) for k, v in kwargs.items()}
        return func(*args, **kwargs)
