"""The local backend of the sweep pipeline (``launch.sweep_backend.SweepBackend``): a sweep's arms
run on this machine, in this process's lanes, through an arm launcher (``launcher.LocalLauncher``).

* ``submit``: takes the sweep folder's run lock (held until ``collect`` or ``close``: a second
  ``run`` into the same folder is refused meanwhile), lists every case in the manifest; nothing
  runs yet.
* ``wait``: runs every arm not yet complete and judges each case once its arms ended
  (``lanes.run_cases``: two lanes, progress, resume); returns when every case is judged.
* ``state``: from the sweep folder alone, so any process can ask (``dcp-harness status`` while
  ``run`` writes the folder): every case of the manifest; a case with a verdict is ``done`` /
  ``failed`` / ``error`` (by its verdict); while a run holds the folder's lock, a case whose
  folder it has written is ``running`` (the arm in flight and its steps), any other ``pending``;
  with no run holding it, a case without a verdict is an ``error`` (the run was interrupted: a
  ``run`` into the same folder resumes it). A backend without a launcher only reads.
* ``collect``: the reports, from the verdicts ``wait`` judged (cases of earlier runs into the same
  folder judged from their files); the lock is released.

Use it as a context manager (``with LocalBackend(...) as backend``) so the lock is released
however the sweep ends. :func:`run_sweep` is the whole of it: the pipeline's ``run_to_end`` on
this backend (``dcp-harness run``, the tests, the benchmarks).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from harness.caseplan import PLAN_FILE, CasePlan
from harness.compare import DEFAULT_ALLOWED_SKIPS, CaseVerdict
from harness.errors import ConfigError
from harness.launch.arm_launcher import ArmLauncher
from harness.launch.case_status import CaseStatus, folder_progress
from harness.launch.local.gpu_lane import GpuSetting
from harness.launch.local.lanes import run_cases, runs_again
from harness.launch.local.progress import NullProgress, SweepProgress
from harness.launch.pipeline import SweepSink, run_to_end
from harness.launch.sweep_backend import Collection, Queued
from harness.launch.sweep_folder import check_resumable, record_manifest
from harness.report import write_reports
from harness.results import ManifestCase, SweepStart, lock_holder, read_manifest, sweep_lock
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


@dataclass
class LocalBackend:
    """This machine's backend (module doc). ``beside(plan)``: the cases run in the second lane
    (``placement.runs_beside_gpu_arms``). ``gpu``: the GPU lane's setting on a machine with
    ``gpus`` GPUs (``gpu_lane.gpu_setting``: ``run --gpu-jobs``); None: one arm after another,
    nothing recorded of their placement."""

    launcher: Optional[ArmLauncher] = None
    progress: Optional[SweepProgress] = None
    allowed_skips: Sequence[str] = DEFAULT_ALLOWED_SKIPS
    beside: Callable[[CasePlan], bool] = lambda plan: False
    gpu: Optional[GpuSetting] = None
    gpus: int = 0
    _submitted: bool = field(default=False, init=False, repr=False)
    _plans: tuple[CasePlan, ...] = field(default=(), init=False, repr=False)
    _verdicts: tuple[CaseVerdict, ...] = field(default=(), init=False, repr=False)
    _lock: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, init=False, repr=False)

    def __enter__(self) -> "LocalBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the sweep folder's run lock (the sweep stays resumable)."""
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
        a local sweep; there is nothing else to give up on)."""
        if not self._submitted:
            raise ConfigError("LocalBackend.wait before submit: nothing was submitted")
        if self.launcher is None:
            raise ConfigError("LocalBackend.wait without a launcher: this backend only reads "
                              "the sweep folder (state)")
        prewarm = getattr(self.launcher, "prewarm", None)  # LocalLauncher: its warm servers
        if prewarm is not None:  # they import beside the first arms, not before each lane's first
            prewarm(self._plans, Path(out_dir), runs_again)
        self._verdicts = tuple(run_cases(self._plans, Path(out_dir), self.launcher,
                                         self.progress or NullProgress(), self.beside,
                                         self.gpu, self.gpus))

    def collect(self, out_dir: Path) -> Collection:
        try:
            reports = write_reports(out_dir, check_plan=check_stored_plan,
                                    allowed_skips=self.allowed_skips,
                                    judged={v.case_id: v for v in self._verdicts})
        finally:
            self.close()
        return Collection(out_dir=Path(out_dir), reports=reports, verdicts=self._verdicts)


def run_sweep(plans: Sequence[CasePlan], out_dir: Path, launcher: ArmLauncher,
              progress: Optional[SweepProgress] = None, start: Optional[SweepStart] = None,
              allowed_skips: Sequence[str] = DEFAULT_ALLOWED_SKIPS,
              beside: Callable[[CasePlan], bool] = lambda plan: False,
              sinks: Sequence[SweepSink] = (), gpu: Optional[GpuSetting] = None,
              gpus: int = 0) -> Collection:
    """List every case in the sweep's manifest, then run every planned arm of every case into
    ``out_dir`` (resuming; cases ``beside`` selects in a second lane, ``lanes.run_cases``), judge
    each case once, write reports from those verdicts (cases of earlier runs into the same folder
    are judged from their files), and hand the folder to ``sinks`` (``pipeline.deliver``)."""
    out_dir = Path(out_dir)
    with LocalBackend(launcher, progress, allowed_skips, beside, gpu, gpus) as backend:
        return run_to_end(backend, plans, out_dir, start, sinks)
