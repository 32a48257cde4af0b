"""Walk many orders fast, and the liveness facts the planner needs from them.

Orders of one rank for different microbatch counts share long prefixes (everything before the
last, partial microbatch group is identical), so :func:`walk_orders` feeds the longest order once,
snapshots the walker's state at every point where another order branches off, and then feeds
only each order's tail from its snapshot. The result is exactly what walking every order from a
fresh start gives (tests check this against a plain walk), at a fraction of the work.

A *frame* is the unit of liveness:

* saved frame ``(chunk, slot)``: a forward of ``chunk`` for microbatch ``m`` makes the frame
  ``(chunk, m % slots)`` live (all of the chunk's layers at once) until that microbatch's backward;
* input-grad frame ``(chunk, slot)``: the input gradient a backward returns stays live until the
  *next* backward event of the rank has finished (its PP send is still in flight), with PP > 1.

Frames are numbered ``chunk * slots + slot`` and sets of frames are int bitmasks.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence, TypeVar, Union

from harness.slotmem.planerrors import PlanError, ScheduleError, SlotPeriodError

State = TypeVar("State")


class Walker(Protocol[State]):
    """What :func:`walk_orders` drives. ``feed`` gets a slice of one order; ``finish`` ends that
    order; ``save``/``load`` copy the per-order walk state (accumulated results are not part of
    it: they are the union over every order walked)."""

    def start(self) -> None: ...

    def feed(self, events: Sequence[int]) -> None: ...

    def finish(self) -> None: ...

    def save(self) -> State: ...

    def load(self, state: State) -> None: ...


def _common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of two byte strings (binary search over C-speed
    slice comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:  # invariant: a[:lo] == b[:lo], a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _key(order: Sequence[int]) -> bytes:
    return (order if isinstance(order, array) else array("i", order)).tobytes()


@dataclass(frozen=True)
class OrderSet:
    """Labelled orders plus, for each, how long a prefix it shares with the longest one
    (``master``). Build once with :meth:`build`, then walk as often as needed."""

    labels: tuple[str, ...]
    orders: tuple[Sequence[int], ...]
    master: int
    cuts: tuple[int, ...]

    @classmethod
    def build(cls, labelled: Sequence[tuple[str, Sequence[int]]]) -> "OrderSet":
        if not labelled:
            return cls((), (), -1, ())
        labels = tuple(label for label, _ in labelled)
        orders = tuple(order for _, order in labelled)
        master = max(range(len(orders)), key=lambda i: len(orders[i]))
        master_key = _key(orders[master])
        item = array("i").itemsize
        cuts = tuple(_common_prefix(master_key, _key(order)) // item for order in orders)
        return cls(labels, orders, master, cuts)


def walk_orders(
    orders: Union[OrderSet, Sequence[tuple[str, Sequence[int]]]], walker: Walker[State]
) -> None:
    """Walk every ``(label, order)`` as if each ran alone from a fresh walker state.

    Errors raised by the walker are re-raised with the label of an order that hits them.
    """
    todo = orders if isinstance(orders, OrderSet) else OrderSet.build(orders)
    if not todo.orders:
        return
    master, master_label = todo.orders[todo.master], todo.labels[todo.master]
    snapshots: dict[int, State] = {}
    walker.start()
    position = 0
    for cut in sorted(set(todo.cuts)):
        _guarded(walker.feed, master[position:cut], master_label)
        position = cut
        snapshots[cut] = walker.save()
    for label, order, cut in zip(todo.labels, todo.orders, todo.cuts):
        walker.load(snapshots[cut])
        _guarded(walker.feed, order[cut:], label)
        _guarded(walker.finish, None, label)


def _guarded(step: Callable[..., None], events: Optional[Sequence[int]], label: str) -> None:
    try:
        if events is None:
            step()
        else:
            step(events)
    except PlanError as exc:
        raise type(exc)(f"{label}: {exc}") from None


class OutstandingCounter:
    """Per chunk, the most forwards whose backward has not run, over every order walked."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.peak = [0] * chunks
        self._live = [0] * chunks

    def start(self) -> None:
        self._live = [0] * self.chunks

    def save(self) -> tuple[int, ...]:
        return tuple(self._live)

    def load(self, state: tuple[int, ...]) -> None:
        self._live = list(state)

    def feed(self, events: Sequence[int]) -> None:
        live, peak = self._live, self.peak
        for e in events:
            if e > 0:
                c = e - 1
                n = live[c] + 1
                live[c] = n
                if n > peak[c]:
                    peak[c] = n
            else:
                c = -e - 1
                if live[c] == 0:
                    raise ScheduleError(f"backward of chunk {c + 1} with no outstanding forward")
                live[c] -= 1

    def finish(self) -> None:
        if any(self._live):
            raise ScheduleError(f"order does not drain: outstanding forwards per chunk {self._live}")


class ConflictBuilder:
    """Conflict graphs of saved frames and input-grad frames over the union of orders walked.

    ``saved_adj[f]`` / ``grad_adj[f]``: bitmask of the frames that are live at the same time as
    frame ``f`` in some order. ``grad_frames`` says which chunks have input-grad frames at all
    (chunks without layers return nothing and are skipped when finding the previous backward).
    Raises :class:`SlotPeriodError` when a forward needs a slot that is still live, or when two
    consecutive backwards would return their grads into the same frame.
    """

    def __init__(
        self, chunks: int, slots: int, grad_chunks: Sequence[bool], grad_in_flight: bool
    ) -> None:
        if slots < 1:
            raise SlotPeriodError(f"physical slots must be >= 1, got {slots}")
        self.chunks = chunks
        self.slots = slots
        self.grad_chunks = tuple(grad_chunks)
        self.grad_in_flight = grad_in_flight
        frames = chunks * slots
        self.saved_adj = [0] * frames
        self.grad_adj = [0] * frames
        self._start_state()

    def _start_state(self) -> None:
        self._fwd = [0] * self.chunks  # next forward microbatch per chunk, modulo slots
        self._bwd = [0] * self.chunks
        self._live = 0
        self._prev_grad = -1

    def start(self) -> None:
        self._start_state()

    def save(self) -> tuple[tuple[int, ...], tuple[int, ...], int, int]:
        return (tuple(self._fwd), tuple(self._bwd), self._live, self._prev_grad)

    def load(self, state: tuple[tuple[int, ...], tuple[int, ...], int, int]) -> None:
        fwd, bwd, self._live, self._prev_grad = state
        self._fwd, self._bwd = list(fwd), list(bwd)

    def feed(self, events: Sequence[int]) -> None:
        slots = self.slots
        fwd, bwd = self._fwd, self._bwd
        saved_adj, grad_adj = self.saved_adj, self.grad_adj
        grad_chunks, in_flight = self.grad_chunks, self.grad_in_flight
        live, prev = self._live, self._prev_grad
        try:
            for e in events:
                if e > 0:
                    c = e - 1
                    s = fwd[c]
                    f = c * slots + s
                    bit = 1 << f
                    if live & bit:
                        raise SlotPeriodError(
                            f"slot period {slots} is shorter than the lifetime of frame "
                            f"(chunk {c}, slot {s}): a forward of chunk {c + 1} needs slot {s} "
                            f"while an earlier microbatch in that slot has not run its backward; "
                            f"use at least the required number of physical slots"
                        )
                    saved_adj[f] |= live
                    live |= bit
                    fwd[c] = s + 1 if s + 1 < slots else 0
                else:
                    c = -e - 1
                    s = bwd[c]
                    f = c * slots + s
                    live &= ~(1 << f)
                    bwd[c] = s + 1 if s + 1 < slots else 0
                    if in_flight and grad_chunks[c]:
                        if prev == f:
                            raise SlotPeriodError(
                                f"slot period {slots} is shorter than the lifetime of input-grad "
                                f"frame (chunk {c}, slot {s}): two consecutive backwards return "
                                f"their input grads into the same frame while the first PP send "
                                f"is in flight"
                            )
                        if prev >= 0:
                            grad_adj[f] |= 1 << prev
                            grad_adj[prev] |= 1 << f
                        prev = f
        finally:
            self._live, self._prev_grad = live, prev

    def finish(self) -> None:
        if self._live:
            raise ScheduleError("order does not drain: some saved frames are still live at the end")

    def symmetric_saved(self) -> list[int]:
        """``saved_adj`` made symmetric (each birth recorded only the frames already live)."""
        adj = list(self.saved_adj)
        for f, mask in enumerate(self.saved_adj):
            m = mask
            while m:
                low = m & -m
                adj[low.bit_length() - 1] |= 1 << f
                m ^= low
        return adj

