"""Which arms share the GPUs of this machine at once (issue 50): the placement rule of the local
backend's GPU lane, a pure function of the arms, their predicted memory, the device's memory and
the figures a neighbour would move.

An arm's figures are its own except two, which a neighbour on the same GPU moves:

* ``step_time``: its step time, where a golden pair judges it (``compare.golden.step_time``): a
  neighbour's kernels and host work slow it down;
* ``device_used``: the whole device's memory after ``empty_cache`` (the memory probe's
  ``device_used_bytes``), where a pair judges it (``dcp_vs_fixed_cp``'s ``device_delta_pct``, a
  golden pair's ``mem_device_used_bytes``): a neighbour's memory is on the same device. The probe
  subtracts what NVML accounts to the other processes (``harness.metrics.device_memory``), so
  where NVML's per-process accounting is readable (``per_process_memory``) this figure is the
  arm's own and a neighbour does not move it.

The rule (:func:`fits`): an arm that a neighbour would move (:func:`runs_alone`) runs with nothing
else on the GPUs; the others run side by side while their predicted bytes (each arm's ranks that
run at once, on the GPU they share, plus a CUDA context per process) stay within the device's
memory and at most ``jobs`` arms run at once. :func:`order` puts the arms that run alone for their
memory first (the device is empty at the start: no waiting for it to drain), then the longest
first, and those whose step time is judged last.
:func:`place` is the schedule this rule gives for arms of known durations (what ``run`` prints
before it starts, and what the tests check); the local backend's GPU lane applies the same
:func:`next_arm` as arms end (``launch.local.gpu_lane``) and records where each one ran
(``results.placement``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

GIB = 2**30
STEP_TIME = "step_time"
DEVICE_USED = "device_used"
# Per process beside its predicted peak: the CUDA context, cuBLAS / cuDNN workspaces and what the
# caching allocator reserves beyond its peak allocation (measured: 0.5-1.5 GiB on the focused
# arms of one H200; bench/RESULTS.md, issue 50).
PROCESS_OVERHEAD_BYTES = 2 * GIB
# An arm with no memory plan (dynamic shapes, fp32: ``plan --memory`` has none) in a case whose
# other arms have one: the case's largest prediction times this; in a case without any: the
# default below.
UNPLANNED_FACTOR = 1.25
UNPLANNED_DEFAULT_BYTES = 8 * GIB
# Of the device's memory free at the start, the share the arms side by side may be predicted to use.
USABLE = 0.9


@dataclass(frozen=True)
class ArmDemand:
    """One arm as the rule sees it: ``key`` (case id, arm name), the bytes it is predicted to
    hold at its peak on each GPU it uses (``predicted``: from the memory plan, or a stand-in),
    the figures of it a neighbour would move, and its expected seconds (for the order only)."""

    key: tuple[str, str]
    bytes: int
    moved: frozenset[str] = frozenset()
    seconds: float = 1.0
    predicted: bool = True

    @property
    def label(self) -> str:
        return f"{self.key[0]} / {self.key[1]}"


def runs_alone(arm: ArmDemand, per_process_memory: bool) -> bool:
    """Whether a neighbour would move a judged figure of ``arm`` (module doc)."""
    return STEP_TIME in arm.moved or (DEVICE_USED in arm.moved and not per_process_memory)


def alone_reason(arm: ArmDemand, per_process_memory: bool) -> Optional[str]:
    """Why ``arm`` runs alone, or None."""
    if STEP_TIME in arm.moved:
        return "its step time is judged against golden values"
    if DEVICE_USED in arm.moved and not per_process_memory:
        return ("its whole-device memory after empty_cache is judged and NVML's per-process "
                "accounting is not readable here")
    return None


def fits(running: Sequence[ArmDemand], arm: ArmDemand, capacity: int, jobs: int,
         per_process_memory: bool) -> bool:
    """Whether ``arm`` may start beside the arms ``running`` (module doc): always on an idle
    device; never beside an arm that runs alone or as one; else within ``jobs`` arms and within
    ``capacity`` bytes predicted."""
    if not running:
        return True
    if len(running) >= jobs or runs_alone(arm, per_process_memory):
        return False
    if any(runs_alone(r, per_process_memory) for r in running):
        return False
    return sum(r.bytes for r in running) + arm.bytes <= capacity


def order(arms: Sequence[ArmDemand], per_process_memory: bool) -> list[ArmDemand]:
    """The order arms are offered to the device: first those that run alone for their memory
    (in the order given), then those that may share it, longest first (ties: the order given),
    last those whose step time is judged (the CPU lane has ended by then: nothing to hold
    still)."""
    timed = [a for a in arms if STEP_TIME in a.moved]
    alone = [a for a in arms if runs_alone(a, per_process_memory) and a not in timed]
    rest = [a for a in arms if not runs_alone(a, per_process_memory)]
    return alone + sorted(rest, key=lambda a: -a.seconds) + timed


def next_arm(pending: Sequence[ArmDemand], running: Sequence[ArmDemand], capacity: int, jobs: int,
             per_process_memory: bool) -> Optional[ArmDemand]:
    """The first of ``pending`` (in :func:`order`) that :func:`fits` beside ``running``; None
    when none does now. An arm predicted larger than the whole capacity still runs, alone
    (``fits`` on an idle device)."""
    for arm in pending:
        if fits(running, arm, capacity, jobs, per_process_memory):
            return arm
        if not running:  # pragma: no cover - fits is True on an idle device
            break
    return None


@dataclass(frozen=True)
class Slot:
    """Where :func:`place` put one arm: when it starts and ends (in its ``seconds``), and the
    arms running beside it at any time of its run."""

    arm: ArmDemand
    start: float
    end: float
    beside: tuple[tuple[str, str], ...]


def place(arms: Sequence[ArmDemand], capacity: int, jobs: int,
          per_process_memory: bool) -> tuple[Slot, ...]:
    """The schedule of ``arms`` under the rule, each taking its ``seconds``: arms start in
    :func:`order` as :func:`next_arm` admits them, the next one when an arm ends. ``jobs`` 1:
    one after another, in order."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    pending = order(arms, per_process_memory)
    running: list[tuple[float, float, ArmDemand]] = []  # (end, start, arm)
    done: list[tuple[float, float, ArmDemand]] = []
    now = 0.0
    while pending or running:
        arm = next_arm(pending, [r[2] for r in running], capacity, jobs, per_process_memory)
        if arm is not None:
            pending.remove(arm)
            running.append((now + arm.seconds, now, arm))
            continue
        running.sort(key=lambda r: r[0])
        end = running.pop(0)
        now = end[0]
        done.append(end)
    slots = []
    for end, start, arm in sorted(done, key=lambda r: (r[1], r[0])):
        beside = tuple(o.key for e, s, o in done if o is not arm and s < end and start < e)
        slots.append(Slot(arm, start, end, beside))
    return tuple(slots)


def groups(slots: Sequence[Slot]) -> tuple[tuple[tuple[str, str], ...], ...]:
    """The arms that overlap, as groups: each maximal set of arms connected by running at once,
    in start order (an arm alone is a group of one)."""
    out: list[list[tuple[str, str]]] = []
    horizon = -1.0
    for s in sorted(slots, key=lambda s: s.start):
        if out and s.start < horizon:
            out[-1].append(s.arm.key)
            horizon = max(horizon, s.end)
        else:
            out.append([s.arm.key])
            horizon = s.end
    return tuple(tuple(g) for g in out)


def capacity_of(free_bytes: int) -> int:
    """The bytes arms side by side may be predicted to use, of ``free_bytes`` free at the start."""
    return int(free_bytes * USABLE)
