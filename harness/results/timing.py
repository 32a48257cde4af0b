"""Where an arm's wall time went, from its ranks' phase marks (``harness.results.phases``) and
its outcome's launch-to-exit wall time.

One rank process's leg splits into :data:`PHASES` (seconds, each None where its marks are
missing):

* ``start``: process created -> the rank entry point runs (interpreter, ``harness`` import);
* ``imports``: -> torch and the workload imported;
* ``rendezvous``: -> process group and process sub-groups made (on CUDA: the CUDA context too);
* ``build``: the model chunks built;
* ``setup``: -> the first step starts: optimizer, data table (a resumed leg's checkpoint load is
  ``checkpoint``, see below);
* ``steps``: the steps' timed parts (the records' ``step_time_s``), summed;
* ``checkpoint``: checkpoint saves (the time after a step that saved one: ``step %
  train.checkpoint_every == 0`` or the leg's ``stop_after``) and, on a leg that resumed, its
  setup beyond a fresh leg's setup of the same rank (the load); on a leg without a fresh one
  beside it, the whole setup;
* ``records``: step records appended durably and logged;
* ``other``: the rest of the leg: between steps (graph capture, memory probes) and after the
  last (process group torn down).

The processes of an arm that overlap in time run side by side (the ranks of a leg); an arm's
figure for a phase is the sum, over its runs one after another (legs, emulated ranks on one
device), of the phase of the process of that run that ended last (the one the arm waited for).
``exit`` is the arm's launch-to-exit wall time less those processes' spans: spawning, interpreter
exit, the launcher's own work between legs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Literal, Optional, Sequence, Union

from .files import PathLike
from .outcome import ArmStatus, read_outcome
from .phases import Leg, StepMark, read_arm_phases

PHASES = ("start", "imports", "rendezvous", "build", "setup", "steps", "checkpoint", "records",
          "other")
SavedStep = Callable[[int, Optional[int]], bool]  # (step, the leg's stop_after) -> saved one


def checkpoint_rule(every: int) -> SavedStep:
    """The workload's rule for the steps that save a checkpoint (``train.checkpoint_every``
    and the leg's ``stop_after``; ``harness.workload.train``)."""
    return lambda step, stop_after: bool(every and step % every == 0) or step == stop_after


@dataclass(frozen=True)
class Phases:
    """Seconds per phase (see the module doc); None where it is not known."""

    start: Optional[float] = None
    imports: Optional[float] = None
    rendezvous: Optional[float] = None
    build: Optional[float] = None
    setup: Optional[float] = None
    steps: Optional[float] = None
    checkpoint: Optional[float] = None
    records: Optional[float] = None
    other: Optional[float] = None


def add_phases(items: Iterable[Phases]) -> Phases:
    """Phase by phase sum (None only where every item has None)."""
    items = list(items)

    def total(name: str) -> Optional[float]:
        values = [getattr(p, name) for p in items if getattr(p, name) is not None]
        return sum(values) if values else None

    return Phases(**{name: total(name) for name in PHASES})


def _span(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return b - a if a is not None and b is not None else None


def leg_begin(leg: Leg) -> Optional[float]:
    """The first mark of a leg (its process's creation where known)."""
    marks = (leg.spawned_at, leg.main_at, leg.entered_at, leg.imported_at)
    return next((m for m in marks if m is not None), None)


def leg_end(leg: Leg) -> Optional[float]:
    """The last mark of a leg."""
    ends = [leg.done_at, leg.trained_at, leg.steps[-1].written_at if leg.steps else None,
            leg.built_at, leg.rendezvous_at, leg.imported_at, leg.entered_at, leg.main_at]
    return max((m for m in ends if m is not None), default=None)


def _after_steps(leg: Leg, saved: SavedStep) -> tuple[float, float]:
    """(checkpoint saves, other) in the time after each step's record was written."""
    ckpt = other = 0.0
    marks: Sequence[StepMark] = leg.steps
    for i, mark in enumerate(marks):
        nxt = marks[i + 1].started_at if i + 1 < len(marks) else leg.trained_at
        if nxt is None:
            continue
        gap = max(0.0, nxt - mark.written_at)
        if saved(mark.step, leg.stop_after):
            ckpt += gap
        else:
            other += gap
    return ckpt, other


def leg_phases(leg: Leg, saved: SavedStep, fresh_setup: Optional[float] = None) -> Phases:
    """The phases of one rank process's leg. ``fresh_setup``: the setup of a leg of the same
    rank that started from step 1 (a resumed leg's setup beyond it is its checkpoint load)."""
    first = leg.steps[0] if leg.steps else None
    setup_from = leg.built_at or leg.rendezvous_at or leg.imported_at
    setup = _span(setup_from, first.started_at if first else leg.trained_at)
    load = 0.0
    if setup is not None and first is not None and first.step > 1:
        load = setup - min(setup, fresh_setup) if fresh_setup is not None else setup
        setup -= load
    ckpt, other = _after_steps(leg, saved)
    end = _span(leg.trained_at, leg.done_at)
    return Phases(
        start=_span(leg.spawned_at, leg.main_at),
        imports=_span(leg.main_at or leg.entered_at, leg.imported_at),
        rendezvous=_span(leg.imported_at, leg.build_started_at or leg.rendezvous_at),
        build=_span(leg.build_started_at, leg.built_at),
        setup=setup,
        steps=sum(m.step_s or 0.0 for m in leg.steps) if leg.steps else None,
        checkpoint=ckpt + load,
        records=sum(m.written_at - m.recorded_at for m in leg.steps) if leg.steps else None,
        other=other + (end or 0.0),
    )


@dataclass(frozen=True)
class ArmTiming:
    """Where one arm's wall time went (see the module doc).

    ``wall_s``: launch to exit (the outcome's; None without an outcome); ``runs``: the runs one
    after another (legs, emulated ranks on one device); ``steps``: the steps its slowest rank
    ran (re-runs after a resume counted again); ``run_steps`` / ``step_span_s``: the steps of
    the process each run waited for, and their time from the first step's start to the last
    step's record written, summed over runs (what the steps cost with everything between them);
    ``device``: where its ranks ran (``cpu``, ``cuda:0``)."""

    status: Union[ArmStatus, Literal["no outcome"]]  # the outcome's, or none yet
    wall_s: Optional[float]
    phases: Phases
    exit: Optional[float]
    runs: int
    ranks: int
    steps: int
    run_steps: int
    step_span_s: float
    device: Optional[str]

    @property
    def per_step_s(self) -> Optional[float]:
        """Seconds per step, everything between steps included (None: no step ran)."""
        return self.step_span_s / self.run_steps if self.run_steps else None

    @property
    def fixed_s(self) -> Optional[float]:
        """The wall time an arm costs besides its steps (start, imports, build, ... , exit)."""
        return None if self.wall_s is None else max(0.0, self.wall_s - self.step_span_s)


def _runs(legs: Sequence[tuple[int, Leg]]) -> list[list[tuple[int, Leg]]]:
    """The legs grouped into runs one after another: legs that overlap in time ran side by side."""
    timed = sorted((leg_begin(l) or 0.0, leg_end(l) or 0.0, r, l) for r, l in legs)
    runs: list[list[tuple[int, Leg]]] = []
    run_end = None
    for begin, end, rank, leg in timed:
        if run_end is None or begin >= run_end:
            runs.append([])
            run_end = end
        run_end = max(run_end, end)
        runs[-1].append((rank, leg))
    return runs


def _fresh_setups(legs: Sequence[tuple[int, Leg]], saved: SavedStep) -> dict[int, float]:
    out: dict[int, float] = {}
    for rank, leg in legs:
        if leg.steps and leg.steps[0].step == 1 and rank not in out:
            setup = leg_phases(leg, saved).setup
            if setup is not None:
                out[rank] = setup
    return out


def arm_timing(arm_dir: PathLike, saved: SavedStep) -> ArmTiming:
    """The timing of one arm folder (its phase marks and outcome); ``saved`` says which steps
    saved a checkpoint (:func:`checkpoint_rule` of the arm's ``train.checkpoint_every``)."""
    outcome = read_outcome(arm_dir)
    ranks = read_arm_phases(arm_dir)
    legs = [(rank, leg) for rank, p in ranks.items() for leg in p.legs]
    fresh = _fresh_setups(legs, saved)
    per_run, spans, steps = [], 0.0, {}
    step_span, run_steps = 0.0, 0
    for run in _runs(legs):
        rank, leg = max(run, key=lambda item: leg_end(item[1]) or 0.0)
        per_run.append(leg_phases(leg, saved, fresh.get(rank)))
        spans += (leg_end(leg) or 0.0) - (leg_begin(leg) or 0.0)
        if leg.steps:
            step_span += leg.steps[-1].written_at - leg.steps[0].started_at
            run_steps += len(leg.steps)
        for r, other in run:
            steps[r] = steps.get(r, 0) + len(other.steps)
    wall = outcome.wall_s if outcome is not None else None
    devices = {leg.device for _, leg in legs if leg.device}
    return ArmTiming(
        status=outcome.status if outcome is not None else "no outcome",
        wall_s=wall, phases=add_phases(per_run),
        exit=None if wall is None or not legs else wall - spans,
        runs=len(per_run), ranks=len(ranks), steps=max(steps.values(), default=0),
        run_steps=run_steps, step_span_s=step_span, device=",".join(sorted(devices)) or None)

