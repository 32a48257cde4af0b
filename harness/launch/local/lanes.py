"""The local backend's run loop: a sweep's cases x arms on this machine, in one or two lanes.

For each case (planned: ``harness.arms.plan_case``): ``sweep_folder.prepare_case_dir`` writes
``case.json`` and ``plan.json``; each planned arm runs unless it is complete (:func:`runs_again`,
``completion.arm_needs_run``: an arm that failed, timed out or was interrupted runs again and
resumes after its last checkpointed step); then the case is judged once
(``sweep_folder.finalize_or_error``). A failing arm never stops the sweep; only Ctrl-C does.
Cases ``beside`` selects (CPU ranks on a machine with GPUs) run in a second lane
(:func:`run_cases`). ``backend.LocalBackend.wait`` calls it; ``golden record --repeats`` runs
arms through :func:`run_arm_into`.
"""

from __future__ import annotations

import threading
import traceback
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from harness.caseplan import CasePlan, PlannedArm
from harness.compare import CaseVerdict
from harness.launch.arm_launcher import ArmLauncher
from harness.launch.local.cpu_lane import run_cpu_lane
from harness.launch.local.gpu_demand import timing_judged_arms
from harness.launch.local.gpu_lane import GpuSetting, run_gpu_lane
from harness.launch.local.progress import SweepProgress
from harness.launch.ranks.completion import arm_needs_run
from harness.launch.sweep_folder import finalize_or_error, prepare_case_dir, remove_checkpoints_if_complete
from harness.results import CASE_FILE, OUTCOME_FILE, VERDICT_FILE, ArmOutcome, write_outcome


def _run_one(launcher: ArmLauncher, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
             case_json: Path) -> ArmOutcome:
    (arm_dir / OUTCOME_FILE).unlink(missing_ok=True)  # no stale outcome for an arm in flight
    try:
        return launcher.run_arm(plan, arm, arm_dir, case_json)
    except Exception as exc:  # the launcher itself broke: record it, keep sweeping
        return ArmOutcome(status="infra", detail=f"launcher raised {type(exc).__name__}: {exc}",
                          log_tail=traceback.format_exc())


def run_arm_into(launcher: ArmLauncher, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
                 case_json: Path, on_start: Optional[Callable[[], None]] = None) -> ArmOutcome:
    """Run one arm into ``arm_dir`` with the sweep's rules, and its outcome: the folder is made,
    ``on_start`` called, a stale outcome removed, a launcher that raises recorded as an ``infra``
    outcome (never raised), the outcome written, and the checkpoints removed once the arm is
    complete. The local sweep and ``golden record --repeats`` both run arms through it."""
    arm_dir.mkdir(parents=True, exist_ok=True)
    if on_start is not None:
        on_start()
    outcome = _run_one(launcher, plan, arm, arm_dir, case_json)
    write_outcome(arm_dir, outcome)
    remove_checkpoints_if_complete(arm, arm_dir)  # finished for good: no resume
    return outcome


class _Quiet:
    """Lets the CUDA lane ask the CPU lane to stand still: ``quiet()`` waits until the CPU lane
    is between two arms and holds it there; the CPU lane calls ``arm()`` around each arm."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._quiet = False

    @contextmanager
    def arm(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._quiet)
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    @contextmanager
    def quiet(self) -> Iterator[None]:
        with self._cond:
            self._quiet = True
            self._cond.wait_for(lambda: not self._busy)
        try:
            yield
        finally:
            with self._cond:
                self._quiet = False
                self._cond.notify_all()


class _Serialized:
    """A progress display called from two lanes: one call at a time."""

    def __init__(self, inner: SweepProgress) -> None:
        self._inner, self._lock = inner, threading.Lock()

    def __getattr__(self, name: str) -> Callable[..., None]:
        method = getattr(self._inner, name)

        def call(*args: Any) -> None:
            with self._lock:
                method(*args)

        return call


def runs_again(arm: PlannedArm, arm_dir: Path) -> bool:
    """Whether the sweep runs ``arm`` (again): it is not complete (a failed or timed-out arm
    too: a new local run retries final outcomes, ``completion.arm_needs_run``)."""
    return arm_needs_run(arm, arm_dir, retry_final=True)


def _run_case(index: int, total: int, plan: CasePlan, out_dir: Path, launcher: ArmLauncher,
              shown: SweepProgress, verdicts: dict[str, CaseVerdict],
              hold: Callable[[PlannedArm], Any]) -> None:
    """Run the case's arms not yet complete, one after another, then judge it. ``hold(arm)`` is
    the context an arm runs in (the lanes' rule of what may run beside it)."""
    case_dir = prepare_case_dir(plan, out_dir, listed=True)
    title = plan.title  # the case id, with its emulated ranks where it has them
    shown.case_started(title, index, len(plan.arms))
    for arm in plan.arms:
        arm_dir = case_dir / arm.name
        if not runs_again(arm, arm_dir):
            shown.arm_skipped(title, arm.name, "already complete")
            continue
        (case_dir / VERDICT_FILE).unlink(missing_ok=True)
        with hold(arm):
            outcome = run_arm_into(
                launcher, plan, arm, arm_dir, case_dir / CASE_FILE,
                on_start=lambda: shown.arm_started(title, arm.name, arm_dir, plan.steps))
        shown.arm_finished(title, arm.name, outcome)
    verdict = finalize_or_error(plan.case_id, case_dir)
    verdicts[plan.case_id] = verdict
    shown.case_finished(title, verdict)


def run_cases(plans: Sequence[CasePlan], out_dir: Path, launcher: ArmLauncher,
               shown: SweepProgress, beside: Callable[[CasePlan], bool] = lambda plan: False,
               gpu: Optional[GpuSetting] = None, gpus: int = 0,
               cores: int = 1) -> list[CaseVerdict]:
    """Every case, in plan order. Cases ``beside`` selects (CPU ranks on a machine with GPUs) run
    in a second lane beside the others, one after another there too; the first lane asks the
    second to stand still while an arm whose step time is judged runs. With ``gpu`` (a machine
    with ``gpus`` GPUs: ``gpu_lane.gpu_setting``) the first lane is the GPU lane
    (``gpu_lane.run_gpu_lane``: arms side by side where their figures allow it, their placement
    recorded); without ``gpu``, ``cores`` > 1 runs the first lane's arms side by side within that
    many CPU cores (``cpu_lane.run_cpu_lane``). Ctrl-C stops both lanes (``launcher.stop()`` ends the other lanes' ranks)."""
    verdicts: dict[str, CaseVerdict] = {}
    indexed = list(enumerate(plans))
    second = [(i, p) for i, p in indexed if beside(p)]
    first = [(i, p) for i, p in indexed if not beside(p)]
    quiet = _Quiet()
    side_by_side = gpu is None and cores > 1 and not second
    shown = _Serialized(shown) if second or gpu is not None or side_by_side else shown
    shown.sweep_started(len(plans))
    failure: list[BaseException] = []
    interrupted = threading.Event()

    def second_arm(arm: PlannedArm) -> Any:
        if interrupted.is_set():  # the first lane was interrupted: start nothing more
            raise KeyboardInterrupt
        return quiet.arm()

    def second_lane() -> None:
        try:
            for i, plan in second:
                _run_case(i, len(plans), plan, out_dir, launcher, shown, verdicts, second_arm)
        except BaseException as exc:  # re-raised by the first lane's thread
            failure.append(exc)

    worker = threading.Thread(target=second_lane, name="cpu-lane", daemon=True)
    try:
        if second:
            worker.start()
        if gpu is not None:
            run_gpu_lane(first, len(plans), out_dir, launcher, shown, verdicts, gpu, gpus,
                         quiet.quiet, runs_again, run_arm_into)
        if side_by_side:
            run_cpu_lane(first, len(plans), out_dir, launcher, shown, verdicts, cores,
                         runs_again, run_arm_into)
        for i, plan in first if gpu is None and not side_by_side else ():
            judged = timing_judged_arms(plan)
            _run_case(i, len(plans), plan, out_dir, launcher, shown, verdicts,
                      lambda arm: quiet.quiet() if arm.name in judged else nullcontext())
        if second:
            worker.join()
    except BaseException:
        interrupted.set()
        stop = getattr(launcher, "stop", None)
        if second and stop is not None:
            stop()
        if second and worker.is_alive():
            worker.join()
        raise
    finally:
        shown.close()
    if failure:
        raise failure[0]
    return [verdicts[p.case_id] for p in plans if p.case_id in verdicts]
