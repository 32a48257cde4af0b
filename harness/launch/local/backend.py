"""The local backend of the sweep pipeline (``launch.sweep_backend.SweepBackend``): a sweep's arms
run on this machine, in this process's lanes, through an arm launcher (``launcher.LocalLauncher``).

* ``submit``: takes the sweep folder's run lock (held until ``collect`` or ``close``: a second
  ``run`` into the same folder is refused meanwhile), lists every case in the manifest; nothing
  runs yet.
* ``wait``: in the process that submitted, runs every arm not yet complete and judges each case
  once its arms ended (``lanes.run_cases``: two lanes, progress, resume); returns when every case
  is judged. In any other process (``dcp-harness collect --wait`` of a folder ``run`` writes):
  waits until no run holds the folder's lock (or the time is up), polling its ``state``.
* ``state``: from the sweep folder alone, so any process can ask (``dcp-harness status`` while
  ``run`` writes the folder): every case of the manifest; a case with a verdict is ``done`` /
  ``failed`` / ``error`` (by its verdict); while a run holds the folder's lock, a case whose
  folder it has written is ``running`` (the arm in flight and its steps), any other ``pending``;
  with no run holding it, a case without a verdict is an ``error`` (the run was interrupted: a
  ``run`` into the same folder resumes it). A backend without a launcher only reads.
* ``collect``: judges, once, every case of the manifest whose arms all ended and that has no
  verdict yet (none after this process's ``wait``: it judged each case it ran; an interrupted
  run's cases whose arms had all ended), writes the reports from those verdicts and the ones
  ``wait`` judged (the other cases judged from their files, once), and releases the lock. In a
  process that did not submit, it takes the lock for that time: a run still writing the folder
  is a ConfigError saying to wait for it.

Use it as a context manager (``with LocalBackend(...) as backend``) so the lock is released
however the sweep ends. :func:`run_sweep` is the whole of it: the pipeline's ``run_to_end`` on
this backend (``dcp-harness run``, the tests, the benchmarks).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import AbstractSet, Any, Callable, Optional, Sequence

from harness.caseplan import PLAN_FILE, CasePlan
from harness.compare import DEFAULT_ALLOWED_SKIPS, CaseVerdict
from harness.errors import ConfigError
from harness.launch.arm_launcher import ArmLauncher
from harness.launch.case_status import CaseStatus, folder_progress
from harness.launch.local.gpu_lane import GpuSetting, lane_ranks_at_once
from harness.launch.local.gpu_demand import timing_judged_arms
from harness.launch.local.lanes import run_cases, runs_again
from harness.launch.local.progress import NullProgress, SweepProgress
from harness.launch.pipeline import SweepSink, run_to_end
from harness.launch.sweep_backend import Collection, FollowOptions, Queued
from harness.launch.sweep_folder import check_resumable, finalize_or_error, record_manifest
from harness.report import FiguresAhead, write_reports
from harness.results import (MANIFEST_FILE, ArmOutcome, ManifestCase, ResultsError, SweepStart,
                             lock_holder, read_manifest, sweep_lock)
from harness.trust.stored_plan import check_stored_plan

_INTERRUPTED = ("no verdict and no run writes the sweep folder (interrupted?): "
                "`dcp-harness run` the same cases with --out {out} resumes it")


def case_status(out_dir: Path, entry: ManifestCase, running: bool) -> CaseStatus:
    """Where a case of a local sweep stands (module doc, ``state``); ``running``: a run holds the
    sweep folder's lock."""
    case_dir = Path(out_dir) / entry.id
    if not (case_dir / PLAN_FILE).is_file():  # not reached by any run yet (written after case.json)
        base = dict(case_id=entry.id, arms_done=0, arms_total=len(entry.arms))
        if running:
            return CaseStatus(state="pending", terminal=False, **base)
        return CaseStatus(state="error", terminal=True, detail=_INTERRUPTED.format(out=out_dir),
                          **base)
    folder = folder_progress(case_dir)
    base = dict(case_id=entry.id, arms_done=folder.arms_done, arms_total=folder.arms_total,
                steps=folder.plan.steps)
    if folder.judged is not None:
        state, verdict = folder.judged
        return CaseStatus(state=state, terminal=True, verdict=verdict, **base)
    if running:
        arm, step = folder.in_flight(case_dir)
        return CaseStatus(state="running", terminal=False, arm=arm, step=step, **base)
    return CaseStatus(state="error", terminal=True, detail=_INTERRUPTED.format(out=out_dir), **base)


NAME = "local"


def owns(sweep_dir: Path) -> bool:
    """Any sweep folder with a manifest (``launch.backends`` asks the other backends first)."""
    return (Path(sweep_dir) / MANIFEST_FILE).is_file()


def follow(options: FollowOptions) -> "LocalBackend":
    """A backend following a local sweep from another process (``status``, ``collect``). A local
    sweep queues nothing again: a nonzero ``retry_infra`` is a ConfigError saying how to re-run."""
    if options.retry_infra:
        raise ConfigError("--retry-infra re-submits Slurm jobs; a sweep of `dcp-harness run` runs "
                          "its failed arms again when you run the same cases with the same --out")
    return LocalBackend(allowed_skips=options.allowed_skips, poll_s=options.poll_s,
                        on_poll=options.on_poll)


@dataclass
class LocalBackend:
    """This machine's backend (module doc). ``beside(plan)``: the cases run in the second lane
    (``placement.runs_beside_gpu_arms``). ``gpu``: the GPU lane's setting on a machine with
    ``gpus`` GPUs (``gpu_lane.gpu_setting``: ``run --gpu-jobs``); None: arms side by side within
    ``cores`` CPU cores (``cpu_lane``; 1: one arm after another), nothing recorded of their
    placement. ``poll_s`` / ``on_poll``: how ``wait`` follows a run of another process."""

    launcher: Optional[ArmLauncher] = None
    progress: Optional[SweepProgress] = None
    allowed_skips: Sequence[str] = DEFAULT_ALLOWED_SKIPS
    beside: Callable[[CasePlan], bool] = lambda plan: False
    gpu: Optional[GpuSetting] = None
    gpus: int = 0
    poll_s: float = 2.0
    on_poll: Optional[Callable[[list[CaseStatus]], None]] = None
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    cores: int = 1
    _submitted: bool = field(default=False, init=False, repr=False)
    _plans: tuple[CasePlan, ...] = field(default=(), init=False, repr=False)
    _verdicts: tuple[CaseVerdict, ...] = field(default=(), init=False, repr=False)
    _lock: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, init=False, repr=False)
    _ahead: Optional[FiguresAhead] = field(default=None, init=False, repr=False)

    def __enter__(self) -> "LocalBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the sweep folder's run lock (the sweep stays resumable) and stop drawing the
        page's figures ahead."""
        if self._ahead is not None:
            self._ahead.close()
        self._lock.close()

    def submit(self, plans: Sequence[CasePlan], out_dir: Path,
               start: Optional[SweepStart] = None) -> tuple[Queued, ...]:
        out_dir = Path(out_dir)
        check_resumable([p.case for p in plans], out_dir)
        self._lock.enter_context(sweep_lock(out_dir))
        record_manifest(plans, out_dir, start)
        self._plans = tuple(plans)
        self._submitted = True
        return tuple(Queued(p.case_id) for p in plans)

    def state(self, out_dir: Path) -> dict[str, CaseStatus]:
        manifest = read_manifest(out_dir)
        entries = sorted(manifest.cases if manifest else (), key=lambda c: c.id)
        running = lock_holder(out_dir) is not None
        return {c.id: case_status(Path(out_dir), c, running) for c in entries}

    def wait(self, out_dir: Path, timeout_s: Optional[float] = None) -> None:
        """Run the submitted cases to their verdicts (``timeout_s``: the arms' own limits bound
        a local sweep; there is nothing else to give up on); in a process that submitted nothing,
        wait until no run holds the folder (module doc)."""
        if not self._submitted:
            self._wait_for_run(Path(out_dir), timeout_s)
            return
        if self.launcher is None:
            raise ConfigError("LocalBackend.wait without a launcher: this backend cannot run the "
                              "cases it submitted")
        prewarm = getattr(self.launcher, "prewarm", None)  # LocalLauncher: its warm servers
        if prewarm is not None:  # they import beside the first arms, not before each lane's first
            per_gpu = lane_ranks_at_once(self.gpu, self.gpus) if self.gpu is not None else None
            prewarm(self._plans, Path(out_dir), runs_again, per_gpu)
        # the page's figures of each case drawn once it is judged, beside the arms still running
        self._ahead = FiguresAhead(Path(out_dir), len(self._plans), self.allowed_skips)
        alone = {(plan.title, arm) for plan in self._plans for arm in timing_judged_arms(plan)}
        shown = _DrawingAhead(self.progress or NullProgress(), self._ahead, alone)
        self._verdicts = tuple(run_cases(self._plans, Path(out_dir), self.launcher, shown,
                                         self.beside, self.gpu, self.gpus, self.cores))

    def _wait_for_run(self, out_dir: Path, timeout_s: Optional[float]) -> None:
        deadline = None if timeout_s is None else self.clock() + timeout_s
        while lock_holder(out_dir) is not None:
            if self.on_poll is not None:
                self.on_poll(list(self.state(out_dir).values()))
            if deadline is not None and self.clock() >= deadline:
                return
            self.sleep(self.poll_s if deadline is None
                       else max(0.0, min(self.poll_s, deadline - self.clock())))

    def collect(self, out_dir: Path) -> Collection:
        out_dir = Path(out_dir)
        busy = (f"wait for it to end: `dcp-harness collect {out_dir} --wait` (or follow it with "
                f"`dcp-harness status {out_dir} --watch`)")
        try:
            with contextlib.nullcontext() if self._submitted else sweep_lock(out_dir, busy=busy):
                verdicts = self._verdicts + judge_ended(out_dir, {v.case_id for v in self._verdicts})
                reports = write_reports(out_dir, check_plan=check_stored_plan, passing_plots=False,
                                        allowed_skips=self.allowed_skips,
                                        judged={v.case_id: v for v in verdicts},
                                        ahead=self._ahead)
        finally:
            self.close()
        return Collection(out_dir=out_dir, reports=reports, verdicts=verdicts)


class _DrawingAhead:
    """A sweep's progress display that also hands each judged case to the page's figures drawn
    ahead (``report.figures_ahead``), and holds that drawing still while an arm of ``alone``
    ((case title, arm): those whose step time is judged, ``gpu_demand.timing_judged_arms``) runs:
    it runs alone, the drawing thread included."""

    def __init__(self, inner: SweepProgress, ahead: FiguresAhead,
                 alone: AbstractSet[tuple[str, str]] = frozenset()) -> None:
        self._inner, self._ahead, self._alone = inner, ahead, alone

    def arm_started(self, case_id: str, arm: str, arm_dir: Path, steps: int) -> None:
        if (case_id, arm) in self._alone:  # before its ranks start: the figure being drawn ends
            self._ahead.hold((case_id, arm))
        self._inner.arm_started(case_id, arm, arm_dir, steps)

    def arm_finished(self, case_id: str, arm: str, outcome: ArmOutcome) -> None:
        self._inner.arm_finished(case_id, arm, outcome)
        self._ahead.release((case_id, arm))

    def case_finished(self, case_id: str, verdict: CaseVerdict) -> None:
        self._inner.case_finished(case_id, verdict)
        self._ahead.case_judged(verdict)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def judge_ended(out_dir: Path, skip: AbstractSet[str]) -> tuple[CaseVerdict, ...]:
    """Judge, once, every case of the manifest outside ``skip`` whose arms all ended (each a
    final outcome) and that has no verdict: a run interrupted after a case's last arm, before it
    was judged."""
    try:
        manifest = read_manifest(out_dir)
    except ResultsError:  # the reports name it
        return ()
    out = []
    for entry in manifest.cases if manifest else ():
        case_dir = Path(out_dir) / entry.id
        if entry.id in skip or not (case_dir / PLAN_FILE).is_file():
            continue
        try:
            folder = folder_progress(case_dir)
        except ResultsError:  # a plan that cannot be read: the reports name it
            continue
        if folder.judged is None and not folder.pending_arms:
            out.append(finalize_or_error(entry.id, case_dir))
    return tuple(out)


def run_sweep(plans: Sequence[CasePlan], out_dir: Path, launcher: ArmLauncher,
              progress: Optional[SweepProgress] = None, start: Optional[SweepStart] = None,
              allowed_skips: Sequence[str] = DEFAULT_ALLOWED_SKIPS,
              beside: Callable[[CasePlan], bool] = lambda plan: False,
              sinks: Sequence[SweepSink] = (), gpu: Optional[GpuSetting] = None,
              gpus: int = 0, cores: int = 1) -> Collection:
    """List every case in the sweep's manifest, then run every planned arm of every case into
    ``out_dir`` (resuming; cases ``beside`` selects in a second lane, ``lanes.run_cases``), judge
    each case once, write reports from those verdicts (cases of earlier runs into the same folder
    are judged from their files), and hand the folder to ``sinks`` (``pipeline.deliver``)."""
    out_dir = Path(out_dir)
    with LocalBackend(launcher, progress, allowed_skips, beside, gpu, gpus, cores=cores) as backend:
        return run_to_end(backend, plans, out_dir, start, sinks)
