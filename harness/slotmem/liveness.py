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
  *next* backward event of the rank has finished (its P2P send is still in flight) and, with
  PP = 1 and VPP > 1, until its same-rank consumer has run (see :class:`GradLifetimes`).

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


class GradLifetimes:
    """Which input-grad frames are live at each backward event of one order.

    A backward of chunk ``c`` (with layers) for microbatch ``m`` returns its input grad into frame
    ``(c, m % slots)``. The frame is live during that event and, with ``in_flight``, until the
    next backward event with layers has finished (the PP send is still in flight); with a
    same-rank consumer (``consumer[c]``, PP=1 with VPP), also until the backward of
    ``(consumer[c], m)`` has finished. Frames are ``chunk * slots + slot``; sets are bitmasks.
    """

    def __init__(self, slots: int, consumer: Sequence[Optional[int]], in_flight: bool) -> None:
        self.slots = slots
        self.consumer = tuple(consumer)
        self.in_flight = in_flight
        self._has_consumer = any(c is not None for c in self.consumer)
        self.start()

    def start(self) -> None:
        self._live = 0  # live grad frames
        self._held = 0  # frames waiting for their consumer's backward
        self._waiting: dict[tuple[int, int], int] = {}  # (consumer chunk, microbatch) -> frame
        self._prev = -1  # frame of the previous backward, in flight until this one ends

    def save(self) -> tuple[int, int, tuple[tuple[tuple[int, int], int], ...], int]:
        return (self._live, self._held, tuple(self._waiting.items()), self._prev)

    def load(self, state: tuple[int, int, tuple[tuple[tuple[int, int], int], ...], int]) -> None:
        self._live, self._held, waiting, self._prev = state
        self._waiting = dict(waiting)

    def backward(self, chunk: int, microbatch: int) -> int:
        """Record the backward of ``(chunk, microbatch)``; return the mask of the other grad frames
        live during it. Raises :class:`SlotPeriodError` if its frame is still live."""
        f = chunk * self.slots + microbatch % self.slots
        bit = 1 << f
        if self._live & bit:
            raise SlotPeriodError(
                f"slot period {self.slots} is shorter than the lifetime of input-grad frame "
                f"(chunk {chunk}, slot {microbatch % self.slots}): microbatch {microbatch} returns "
                f"its input grad there while an earlier grad in that frame is still in flight or "
                f"not yet consumed; use more physical slots"
            )
        others = self._live
        if not self._has_consumer:  # fast path: only the previous backward's grad is live
            self._live = bit if self.in_flight else 0
            self._prev = f if self.in_flight else -1
            return others
        self._live |= bit
        done = []
        if self._prev >= 0:
            done.append(self._prev)
        consumed = self._waiting.pop((chunk, microbatch), -1)
        if consumed >= 0:
            self._held &= ~(1 << consumed)
            done.append(consumed)
        consumer = self.consumer[chunk]
        if consumer is not None:
            self._waiting[(consumer, microbatch)] = f
            self._held |= bit
        self._prev = f if self.in_flight else -1
        if not self.in_flight:
            done.append(f)
        for g in done:
            if g != self._prev and not self._held >> g & 1:
                self._live &= ~(1 << g)
        return others

    def drained(self) -> bool:
        return not self._waiting

    def live_mask(self) -> int:
        """The grad frames live after the last backward recorded (bitmask)."""
        return self._live


def grad_lifetimes(
    slots: int, layers: Sequence[int], pp: int
) -> tuple[list[bool], GradLifetimes]:
    """The grad-liveness rule of a rank: which chunks return grads (those with layers) and a
    :class:`GradLifetimes` with ``in_flight`` when grads go over P2P (PP > 1 or VPP > 1) and, with
    PP = 1 and VPP > 1, each chunk's same-rank consumer (the nearest lower chunk with layers)."""
    has = [n > 0 for n in layers]
    consumer: list[Optional[int]] = []
    for c in range(len(layers)):
        lower = [k for k in range(c) if has[k]]
        consumer.append(lower[-1] if pp == 1 and lower else None)
    return has, GradLifetimes(slots, consumer, pp > 1 or len(layers) > 1)


class ConflictBuilder:
    """Conflict graphs of saved frames and input-grad frames over the union of orders walked.

    ``saved_adj[f]`` / ``grad_adj[f]``: bitmask of the frames that are live at the same time as
    frame ``f`` in some order (see :class:`GradLifetimes` for the input-grad rule; chunks without
    layers return no grad). Raises :class:`SlotPeriodError` when a forward needs a slot that is
    still live, or an input-grad frame is needed while still live.
    """

    def __init__(self, chunks: int, slots: int, layers: Sequence[int], pp: int) -> None:
        if slots < 1:
            raise SlotPeriodError(f"physical slots must be >= 1, got {slots}")
        if len(layers) != chunks:
            raise PlanError(f"{len(layers)} layer counts for {chunks} chunks")
        self.chunks = chunks
        self.slots = slots
        self.grad_chunks, self._grads = grad_lifetimes(slots, layers, pp)
        frames = chunks * slots
        self.saved_adj = [0] * frames
        self.grad_adj = [0] * frames
        self._start_state()

    def _start_state(self) -> None:
        self._fwd = [0] * self.chunks  # forwards so far per chunk (absolute microbatch)
        self._bwd = [0] * self.chunks
        self._live = 0
        self._grads.start()

    def start(self) -> None:
        self._start_state()

    def save(self) -> tuple:
        return (tuple(self._fwd), tuple(self._bwd), self._live, self._grads.save())

    def load(self, state: tuple) -> None:
        fwd, bwd, self._live, grads = state
        self._fwd, self._bwd = list(fwd), list(bwd)
        self._grads.load(grads)

    def feed(self, events: Sequence[int]) -> None:
        slots = self.slots
        fwd, bwd = self._fwd, self._bwd
        saved_adj, grad_adj = self.saved_adj, self.grad_adj
        grad_chunks, grads = self.grad_chunks, self._grads
        live = self._live
        try:
            for e in events:
                if e > 0:
                    c = e - 1
                    m = fwd[c]
                    f = c * slots + m % slots
                    bit = 1 << f
                    if live & bit:
                        raise SlotPeriodError(
                            f"slot period {slots} is shorter than the lifetime of frame "
                            f"(chunk {c}, slot {m % slots}): the forward of chunk {c + 1} "
                            f"microbatch {m} needs slot {m % slots} while microbatch {m - slots} "
                            f"has not run its backward; use at least the required number of "
                            f"physical slots"
                        )
                    saved_adj[f] |= live
                    live |= bit
                    fwd[c] = m + 1
                else:
                    c = -e - 1
                    m = bwd[c]
                    live &= ~(1 << (c * slots + m % slots))
                    bwd[c] = m + 1
                    if grad_chunks[c]:
                        grad_adj[c * slots + m % slots] |= grads.backward(c, m)
        finally:
            self._live = live

    def finish(self) -> None:
        if self._live:
            raise ScheduleError("order does not drain: some saved frames are still live at the end")
        if not self._grads.drained():
            raise ScheduleError("order does not drain: some input grads are never consumed")

    def symmetric_saved(self) -> list[int]:
        """``saved_adj`` made symmetric (each birth recorded only the frames already live)."""
        return _symmetric(self.saved_adj)

    def symmetric_grad(self) -> list[int]:
        """``grad_adj`` made symmetric."""
        return _symmetric(self.grad_adj)


def _symmetric(adjacency: Sequence[int]) -> list[int]:
    adj = list(adjacency)
    for f, mask in enumerate(adjacency):
        m = mask
        while m:
            low = m & -m
            adj[low.bit_length() - 1] |= 1 << f
            m ^= low
    return adj


class PlanChecker:
    """Walker for :meth:`harness.slotmem.plan.SlotPlan.validate`: replays orders event by event
    against a plan's own slot ring and colours (``saved[(chunk, slot, layer)]``,
    ``grad[(chunk, slot)]``), independent of :class:`ConflictBuilder`'s graphs. Raises
    :class:`SlotPeriodError` for a slot reused while live and :class:`PlanError` for two live
    saved frames, or two live input-grad frames (:class:`GradLifetimes`), sharing a colour."""

    def __init__(
        self,
        slots: int,
        layers: Sequence[int],
        pp: int,
        saved: dict[tuple[int, int, int], int],
        grad: dict[tuple[int, int], int],
    ) -> None:
        self.chunks, self.slots, self.layers = len(layers), slots, tuple(layers)
        self.saved, self.grad = saved, grad
        _, self._grads = grad_lifetimes(slots, layers, pp)
        self.start()

    def start(self) -> None:
        self._fwd = [0] * self.chunks
        self._bwd = [0] * self.chunks
        self._live: dict[tuple[int, int], int] = {}  # live (chunk, slot) -> microbatch
        self._colours: dict[int, tuple[int, int, int]] = {}  # live saved colour -> frame
        self._grads.start()

    def save(self) -> tuple:
        return (tuple(self._fwd), tuple(self._bwd), dict(self._live), dict(self._colours),
                self._grads.save())

    def load(self, state: tuple) -> None:
        fwd, bwd, live, colours, grads = state
        self._fwd, self._bwd = list(fwd), list(bwd)
        self._live, self._colours = dict(live), dict(colours)
        self._grads.load(grads)

    def feed(self, events: Sequence[int]) -> None:
        S = self.slots
        for e in events:
            c = abs(e) - 1
            if e > 0:
                m = self._fwd[c]
                self._fwd[c] += 1
                frame = (c, m % S)
                if frame in self._live:
                    raise SlotPeriodError(
                        f"chunk {c} microbatch {m} reuses physical slot {m % S} while microbatch "
                        f"{self._live[frame]} still holds it (physical_slots {S} too small)"
                    )
                self._live[frame] = m
                for layer in range(self.layers[c]):
                    key = (c, m % S, layer)
                    colour = self.saved[key]
                    if colour in self._colours:
                        raise PlanError(
                            f"saved colour {colour} is given to live frames (chunk, slot, layer) "
                            f"{self._colours[colour]} and {key}: frames live at the same time "
                            f"cannot share saved colour {colour}"
                        )
                    self._colours[colour] = key
            else:
                m = self._bwd[c]
                self._bwd[c] += 1
                frame = (c, m % S)
                if self._live.pop(frame, None) != m:
                    raise ScheduleError(f"backward of chunk {c + 1} microbatch {m} was never live")
                for layer in range(self.layers[c]):
                    del self._colours[self.saved[(c, m % S, layer)]]
                if self.layers[c]:
                    others = self._grads.backward(c, m)
                    while others:
                        low = others & -others
                        others ^= low
                        g = low.bit_length() - 1
                        other = (g // S, g % S)
                        if self.grad[other] == self.grad[frame]:
                            raise PlanError(
                                f"grad colour {self.grad[frame]} is given to live input-grad frames "
                                f"(chunk, slot) {other} and {frame} (grad in flight or not yet "
                                f"consumed): frames live at the same time cannot share grad colour "
                                f"{self.grad[frame]}"
                            )

    def finish(self) -> None:
        if self._live:
            raise ScheduleError(f"order does not drain: frames {sorted(self._live)} still live")
        if not self._grads.drained():
            raise ScheduleError("order does not drain: some input grads are never consumed")
