"""Process-wide state a capture may change and must give back, also when it fails.

:class:`ProcessStateGuard` snapshots, on entry: (with a device) the CUDA RNG state and the
device's current stream, grad mode, the saved-tensor hooks stack top and the dispatch-mode
stack. On exit it always restores the stream and grad mode and removes any saved-tensor hooks
or dispatch modes left above the entry state (a forward that raised between entering and
leaving one, a callable that leaked one); after a failure it also restores the CUDA RNG state,
so a failed capture leaves the generator as it found it (a successful one restores it after
warmup, see :mod:`.capture`). What it had to remove is listed in ``removed``.

(The GC and the allocator settings are :class:`~.allocator.CaptureGuard`'s job.)
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch
from torch.utils import _python_dispatch as dispatch


def _top_hooks() -> Any:
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


class ProcessStateGuard:
    """See the module docstring. ``device``: the CUDA device of the capture (``None``: no CUDA
    state); ``cuda``: the ``torch.cuda`` namespace (tests pass a stand-in)."""

    def __init__(self, device: torch.device | None = None, cuda: Any = None) -> None:
        self.device = device
        self.removed: list[str] = []
        self._cuda = torch.cuda if cuda is None else cuda
        self._cuda_rng: torch.Tensor | None = None
        self._stream: Any = None
        self._grad = True
        self._hooks: Any = None
        self._modes = 0

    def __enter__(self) -> "ProcessStateGuard":
        if self.device is not None:
            self._cuda_rng = self._cuda.get_rng_state(self.device)
            self._stream = self._cuda.current_stream(self.device)
        self._grad = torch.is_grad_enabled()
        self._hooks = _top_hooks()
        self._modes = len(dispatch._get_current_dispatch_mode_stack())
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        problems: list[str] = []
        for step in (self._drop_modes, self._drop_hooks, self._restore_stream):
            try:
                step()
            except Exception as err:  # never mask the capture's own error with a cleanup error
                problems.append(f"{step.__name__}: {err}")
        torch.set_grad_enabled(self._grad)
        if exc is not None:
            try:
                self.restore_rng()
            except Exception as err:
                problems.append(f"restore_rng: {err}")
            if problems and hasattr(exc, "add_note"):  # Python >= 3.11
                for p in problems:
                    exc.add_note(f"[slotmem] cleanup after the failed capture: {p}")
        elif problems:
            raise RuntimeError(f"could not restore process state after capture: {problems}")

    def restore_rng(self) -> None:
        """Put the device's CUDA generator back to its state at entry."""
        if self.device is not None and self._cuda_rng is not None:
            self._cuda.set_rng_state(self._cuda_rng, self.device)

    def _drop_modes(self) -> None:
        while len(dispatch._get_current_dispatch_mode_stack()) > self._modes:
            mode = dispatch._pop_mode()
            self.removed.append(f"dispatch mode {type(mode).__name__}")

    def _drop_hooks(self) -> None:
        for _ in range(64):  # the stack is never this deep; bounds a hook that cannot be popped
            top = _top_hooks()
            if top is None or top is self._hooks or top == self._hooks:
                return
            torch._C._autograd._pop_saved_tensors_default_hooks()
            self.removed.append("saved-tensor hooks")
        raise RuntimeError("saved-tensor hooks left behind could not be removed")

    def _restore_stream(self) -> None:
        if self.device is not None and self._cuda.current_stream(self.device) != self._stream:
            self._cuda.set_stream(self._stream)
            self.removed.append("current stream")
