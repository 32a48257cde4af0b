"""Where a rank process's wall time went: ``<arm>/phases.rank<k>.json``.

A rank process (``harness.launch.ranks.rank_main``) marks wall-clock times (``time.time()``, seconds
since the epoch, comparable across the processes of one machine) as it goes, in a
:class:`PhaseRecorder`, and writes them when it ends as one :class:`Leg` appended to its rank's
file: an interrupted arm (``compare.resume``) or a resumed one has one leg per process that ran.
Nothing here judges anything: the marks are for people planning their time (``bench/arm_phases.py``,
``harness.results.timing``), never part of a verdict.

The marks of a leg, in the order they happen (each None where it did not happen or is not known):

* ``spawned_at``: the process was created (Linux ``/proc/self/stat``, 10 ms resolution), on the
  leg the process was started for (None on a later leg of a process running several);
* ``main_at``: the rank entry point started running (interpreter start and ``harness`` import
  done); None when ``run_rank`` was called by a process running several arms (a Slurm task);
* ``entered_at``: ``run_rank`` was entered;
* ``imported_at``: torch and the workload are imported;
* ``rendezvous_at``: ``init_distributed`` returned (process group and, on CUDA, the context);
* ``build_started_at`` / ``built_at``: this rank's model chunks were being built (after the
  process groups: ``built_at - build_started_at`` is the model build alone);
* ``steps``: per step the rank ran, when its timed part started (``recorded_at - step_s``), when
  the record reached the rank process and when it was written (appended durably and logged);
* ``trained_at``: the training function returned (after the last step's checkpoint);
* ``done_at``: the rank's work ended (process group destroyed); None when it raised.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import ConfigDict

from .files import PathLike, ResultsError
from .records import Float, Int, Str
from .typed import read_json_record, write_json_record

PHASES_FILE = re.compile(r"^phases\.rank(\d+)\.json$")
_FORBID = ConfigDict(extra="forbid")
Mark = Literal["main_at", "entered_at", "imported_at", "rendezvous_at", "build_started_at",
               "built_at", "trained_at", "done_at"]


def phases_file(arm_dir: PathLike, rank: int) -> Path:
    """``<arm>/phases.rank<k>.json``."""
    return Path(arm_dir) / f"phases.rank{rank}.json"


@dataclass(frozen=True)
class StepMark:
    """One step of one rank: its timed part started at ``recorded_at - step_s``."""

    __pydantic_config__ = _FORBID

    step: Int
    step_s: Optional[Float]  # the record's step_time_s (None when it had none)
    recorded_at: Float  # the record reached the rank process (its on_step callback)
    written_at: Float  # the record was appended durably to rank<k>.jsonl and logged

    @property
    def started_at(self) -> float:
        return self.recorded_at - (self.step_s or 0.0)


@dataclass(frozen=True)
class Leg:
    """The marks of one rank process's run of an arm (see the module doc)."""

    __pydantic_config__ = _FORBID

    pid: Int
    device: Optional[Str] = None
    stop_after: Optional[Int] = None
    spawned_at: Optional[Float] = None
    main_at: Optional[Float] = None
    entered_at: Optional[Float] = None
    imported_at: Optional[Float] = None
    rendezvous_at: Optional[Float] = None
    build_started_at: Optional[Float] = None
    built_at: Optional[Float] = None
    steps: tuple[StepMark, ...] = ()
    trained_at: Optional[Float] = None
    done_at: Optional[Float] = None


@dataclass(frozen=True)
class RankPhases:
    """Every leg one rank of an arm ran, oldest first (``phases.rank<k>.json``)."""

    __pydantic_config__ = _FORBID

    rank: Int
    legs: tuple[Leg, ...] = ()



def process_spawned_at() -> Optional[float]:
    """When this process was created, as ``time.time()`` (Linux; None elsewhere): its start in
    clock ticks after boot (``/proc/self/stat`` field 22) against ``CLOCK_BOOTTIME`` now."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of the whole line; fields 1-2 are before the ")"
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - (since_boot - ticks / hz)


class PhaseRecorder:
    """Collects the marks of one leg as the rank process runs (the one mutable piece: a rank
    fills it in as it goes) and :meth:`write` appends them to its rank's file as a :class:`Leg`."""

    def __init__(self, spawned_at: Optional[float] = None) -> None:
        """``spawned_at``: when the process this leg is the first of was created
        (:func:`process_spawned_at`); None for a leg of a process that runs several."""
        self._marks: dict[str, Any] = {"pid": os.getpid(), "spawned_at": spawned_at}
        self._steps: list[StepMark] = []

    def mark(self, name: Mark, at: Optional[float] = None) -> None:
        """Mark ``name`` now (or at ``at``, a ``time.time()`` taken earlier)."""
        self._marks[name] = time.time() if at is None else at

    def note(self, *, device: Optional[str] = None, stop_after: Optional[int] = None) -> None:
        """Where the leg runs and the step it stops after (None: it runs to the end)."""
        self._marks.update(device=device, stop_after=stop_after)

    def step(self, step: int, step_s: Optional[float], recorded_at: float) -> None:
        """Step ``step`` (timed ``step_s``) reached the rank at ``recorded_at``, written now."""
        self._steps.append(StepMark(step, step_s, recorded_at, time.time()))

    @property
    def leg(self) -> Leg:
        return Leg(steps=tuple(self._steps), **self._marks)

    def write(self, arm_dir: PathLike, rank: int) -> Path:
        """Append this leg to ``<arm_dir>/phases.rank<rank>.json`` (atomically; a file that cannot
        be read is replaced: marks are for people, never worth failing a rank over)."""
        try:
            old = read_phases(arm_dir, rank)
        except ResultsError:
            old = None
        legs = (old.legs if old is not None else ()) + (self.leg,)
        return write_json_record(phases_file(arm_dir, rank), RankPhases(rank, legs))


def read_phases(arm_dir: PathLike, rank: int) -> Optional[RankPhases]:
    """The marks of one rank of an arm; None when it wrote none (a ResultsError naming the file
    when they cannot be read)."""
    return read_json_record(phases_file(arm_dir, rank), RankPhases, "phase marks",
                            nonfinite=False)


def read_arm_phases(arm_dir: PathLike) -> dict[int, RankPhases]:
    """Rank -> marks of every ``phases.rank<k>.json`` in an arm folder (missing folder -> {})."""
    d = Path(arm_dir)
    if not d.is_dir():
        return {}
    ranks = sorted(int(m.group(1)) for p in d.iterdir() if (m := PHASES_FILE.match(p.name)))
    found = {rank: read_phases(d, rank) for rank in ranks}
    return {rank: p for rank, p in found.items() if p is not None}
