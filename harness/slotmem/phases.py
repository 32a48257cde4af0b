"""The explicit phases of slot-shared capture, as state you can see (pure Python, no torch).

Like the execution state PyTorch's ``cudagraph_trees.py`` keeps for its tree manager, a capture
session is always in exactly one :class:`Phase`, moves only along the arrows below, and every
method that depends on a phase checks it first (:meth:`PhaseState.require`)::

    PREPARE -> WARMUP -> LAYOUT -> CAPTURE -> REPLAY -> CLOSED
       \\---------\\---------\\---------\\-> FAILED

Invariants per phase (checked by the session that owns the state, see :mod:`.capture`):

* ``WARMUP`` done: one observed plan per (cp_size, chunk, layer); the CP variants of one
  (chunk, layer) agree on tensor count, rank, dtype and requires_grad.
* ``LAYOUT`` done: one backing allocation in the pool holds every arena; it is the pool's only
  live block.
* ``CAPTURE``: at every lockstep boundary the pool's live set is the checkpoint's (every variant
  of an event leaves the identical allocator state); when it ends, every forward with a
  differentiable output has its backward graph, no capture-time autograd root is left, and the
  backing is again the pool's only live block.
* ``REPLAY``: graphs replay by ``(cp_size, microbatch % slots)``; ``CLOSED``: graphs reset,
  replay refused. ``FAILED``: everything of the session was released.
"""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    PREPARE = "prepare"  # arguments checked, nothing run on the device
    WARMUP = "warmup"  # eager passes over the order, one variant at a time
    LAYOUT = "layout"  # arenas planned and the backing allocated in the pool
    CAPTURE = "capture"  # lockstep capture with allocator rewinds
    REPLAY = "replay"  # graphs ready
    CLOSED = "closed"  # graphs reset
    FAILED = "failed"  # a phase raised; nothing of the session is left


_NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.PREPARE: frozenset({Phase.WARMUP, Phase.FAILED}),
    Phase.WARMUP: frozenset({Phase.LAYOUT, Phase.FAILED}),
    Phase.LAYOUT: frozenset({Phase.CAPTURE, Phase.FAILED}),
    Phase.CAPTURE: frozenset({Phase.REPLAY, Phase.FAILED}),
    Phase.REPLAY: frozenset({Phase.CLOSED}),
    Phase.CLOSED: frozenset(),
    Phase.FAILED: frozenset(),
}


class PhaseError(RuntimeError):
    """A step ran in the wrong phase (a bug in the caller or in capture itself)."""


class PhaseState:
    """The current phase and every phase entered so far (``history``)."""

    def __init__(self, start: Phase = Phase.PREPARE) -> None:
        self.phase = start
        self.history: list[Phase] = [start]

    def advance(self, to: Phase) -> None:
        if to not in _NEXT[self.phase]:
            allowed = sorted(p.value for p in _NEXT[self.phase]) or ["none"]
            raise PhaseError(f"cannot go from phase {self.phase.value} to {to.value} (allowed: {', '.join(allowed)})")
        self.phase = to
        self.history.append(to)

    def require(self, *phases: Phase, what: str) -> None:
        if self.phase not in phases:
            raise PhaseError(f"{what} needs phase {' or '.join(p.value for p in phases)}, but the session is in "
                             f"phase {self.phase.value}")

    def fail(self) -> None:
        """Enter ``FAILED`` from any phase that may fail (a no-op once failed)."""
        if self.phase is not Phase.FAILED:
            self.advance(Phase.FAILED)

    def __repr__(self) -> str:
        return f"PhaseState({' -> '.join(p.value for p in self.history)})"
