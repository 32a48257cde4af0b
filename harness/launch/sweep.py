"""A sweep: cases x arms, run by a launcher, judged, reported; re-running it resumes.

Each case comes planned (``harness.arms.plan_case``). For each: ``prepare_case_dir`` writes
``case.json`` and the plan (``plan.json``, with the case's golden values as they are now); each
planned arm runs unless it is complete (``completion.arm_needs_run``: its outcome says ``ok`` and
every rank it records on holds every step; an arm that failed, timed out or was interrupted runs
again and resumes after its last checkpointed step); ``finalize_case`` evaluates the planned
pairs and writes ``verdict.json``. A failing arm never stops the sweep; only Ctrl-C does. The
local backend (``local_backend``: ``run_sweep``) runs a sweep's cases through :func:`run_cases`
and writes the reports; a Slurm job's task reads ``load_plan``, ``collect`` calls
``finalize_case``.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import traceback
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from harness.caseplan import UNHASHED_FIELDS, CasePlan, PlannedArm, read_plan, write_plan
from harness.compare import (
    ARM_CHECKS_CONTRACT,
    ARM_CHECKS_PAIR,
    CaseVerdict,
    PairVerdict,
    write_verdict,
)
from harness.errors import ConfigError
from harness.judge import judge, read_arms
from harness.launch.launcher import ArmLauncher
from harness.launch.progress import NullProgress, SweepProgress
from harness.launch.ranks.completion import arm_is_complete, arm_needs_run
from harness.launch.ranks.rank_main import CHECKPOINT_DIR
from harness.results import (
    CASE_FILE,
    OUTCOME_FILE,
    VERDICT_FILE,
    ArmOutcome,
    ResultsError,
    SweepStart,
    add_to_manifest,
    inherited,
    read_json,
    write_json_atomic,
    write_outcome,
)
from harness.results.code import HARNESS_REPO, code_versions
from harness.spec.command import command_dir
from harness.spec.names import GOLDEN
from harness.spec.schema import Case


# --------------------------------------------------------------------------- case folders
def _comparable(dump: Any) -> Any:
    if isinstance(dump, dict):
        return {k: v for k, v in dump.items() if k not in UNHASHED_FIELDS}
    return dump


def check_resumable(cases: Sequence[Case], out_dir: Path) -> None:
    """ConfigError when ``out_dir`` already holds a case with one of these ids but a different
    definition (resuming would mix results of two different cases). Writes nothing."""
    for case in cases:
        path = Path(out_dir) / case.id / CASE_FILE
        if not path.is_file():
            continue
        try:
            stored = read_json(path)
        except Exception as exc:  # a corrupt case.json cannot be resumed either
            raise ConfigError(f"{path} is unreadable ({exc}); pass a fresh --out folder") from exc
        if _comparable(stored) != _comparable(case.model_dump(mode="json")):
            raise ConfigError(
                f"{out_dir} already holds results of case '{case.id}' with a different definition "
                f"({path}); pass a fresh --out folder, or delete {path.parent} to re-run it"
            )


def sweep_start(command: str, cases: Sequence[Case], gpus: int, *, paths: Sequence[str] = (),
                k: Optional[str] = None, tags: Optional[Sequence[str]] = None,
                emulate_ranks: Optional[str] = None, label: Optional[str] = None) -> SweepStart:
    """The manifest's record of one ``run`` or ``submit``: what it selected, where it ran, the
    history label it asked for."""
    return SweepStart(command=command, started=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      paths=tuple(str(p) for p in paths), k=k,
                      tags=tuple(tags) if tags is not None else None, emulate_ranks=emulate_ranks,
                      host=socket.gethostname(), gpus=gpus, cases=tuple(c.id for c in cases),
                      environment=inherited(os.environ, [n for c in cases if c.command is not None
                                                         for n in c.command.secret_env]),
                      code=code_versions({c.id: code_folder(c) for c in cases}), label=label)


def code_folder(case: Case) -> Path:
    """The folder of the code a case runs: its command's for a command case, else this
    repository's (``harness.results.code``)."""
    return command_dir(case.source, case.command) if case.command is not None else HARNESS_REPO


def record_manifest(plans: Sequence[CasePlan], out_dir: Path,
                    start: Optional[SweepStart] = None) -> None:
    """List ``plans`` (and the invocation ``start``) in the sweep's manifest, before any of them
    runs: the gate then knows what the sweep is to hold (``harness.results.manifest``)."""
    add_to_manifest(out_dir, [p.manifest_entry() for p in plans], start)


def prepare_case_dir(plan: CasePlan, out_dir: Path) -> Path:
    """Create ``<out_dir>/<case id>/`` with ``case.json`` (kept when it is there: a resumed
    sweep) and ``plan.json`` (written every time, so a resumed sweep judges by the golden values
    as they are now), listed in the manifest; the case folder."""
    check_resumable([plan.case], out_dir)
    case_dir = Path(out_dir) / plan.case_id
    case_dir.mkdir(parents=True, exist_ok=True)
    path = case_dir / CASE_FILE
    if not path.is_file():
        write_json_atomic(path, plan.case.model_dump(mode="json"))
    write_plan(case_dir, plan)
    record_manifest([plan], out_dir)
    return case_dir


def load_plan(case_dir: Path) -> CasePlan:
    """The plan of a case folder (``harness.caseplan.read_plan``)."""
    return read_plan(case_dir)


def remove_checkpoints_if_complete(arm: PlannedArm, arm_dir: Path) -> bool:
    """Remove ``<arm>/checkpoint`` once the arm is complete (nothing left to resume): the one
    rule for local sweeps (after each arm) and Slurm sweeps (``collect``). True when removed."""
    if not arm_is_complete(arm, arm_dir):
        return False
    shutil.rmtree(Path(arm_dir) / CHECKPOINT_DIR, ignore_errors=True)
    return True


def finalize_case(case_dir: Path) -> CaseVerdict:
    """Judge a case from its folder alone (its plan, outcomes and step records:
    ``harness.judge``) and write ``verdict.json``. The gate checks it with the same judge."""
    case_dir = Path(case_dir)
    plan = load_plan(case_dir)
    verdict = judge(plan, read_arms(case_dir, plan), sweep_dir=str(case_dir.resolve().parent))
    write_verdict(case_dir, verdict)
    return verdict


# --------------------------------------------------------------------------- the sweep
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


def _finalize_or_error(case_id: str, case_dir: Path) -> CaseVerdict:
    try:
        return finalize_case(case_dir)
    except (ResultsError, ValueError, KeyError, OSError) as exc:  # unreadable results: an error
        pair = PairVerdict(case_id, ARM_CHECKS_PAIR, ARM_CHECKS_CONTRACT, (), (), "error",
                           f"could not evaluate {case_dir}: {type(exc).__name__}: {exc}")
        verdict = CaseVerdict(case_id, (pair,), "error")
        write_verdict(case_dir, verdict)
        return verdict


def timing_judged_arms(plan: CasePlan) -> frozenset[str]:
    """The arms whose step time a golden pair judges (``compare.golden.step_time``): nothing may
    run beside them, not even on other devices, while they run."""
    return frozenset(a for p in plan.pairs if p.contract == GOLDEN and p.skipped is None
                     and getattr(p.params, "step_time", None) is not None for a in p.arms)


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
    case_dir = prepare_case_dir(plan, out_dir)
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
    verdict = _finalize_or_error(plan.case_id, case_dir)
    verdicts[plan.case_id] = verdict
    shown.case_finished(title, verdict)


def run_cases(plans: Sequence[CasePlan], out_dir: Path, launcher: ArmLauncher,
               shown: SweepProgress, beside: Callable[[CasePlan], bool] = lambda plan: False
               ) -> list[CaseVerdict]:
    """Every case, in plan order. Cases ``beside`` selects (CPU ranks on a machine with GPUs) run
    in a second lane beside the others, one after another there too; the first lane asks the
    second to stand still while an arm whose step time is judged runs. Ctrl-C stops both lanes
    (``launcher.stop()`` ends the second lane's ranks)."""
    verdicts: dict[str, CaseVerdict] = {}
    indexed = list(enumerate(plans))
    second = [(i, p) for i, p in indexed if beside(p)]
    first = [(i, p) for i, p in indexed if not beside(p)]
    quiet = _Quiet()
    shown = _Serialized(shown) if second else shown
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
        for i, plan in first:
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
