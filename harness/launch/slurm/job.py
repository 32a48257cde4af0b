"""What runs inside a Slurm allocation: every planned arm of one case, one after another, on every
task.

:class:`CaseJob` is the callable submitit pickles: the case folder, whose ``plan.json`` (written at
submit time) says which arms run on which ranks. srun starts it once per task (one task per GPU);
each task takes its rank from Slurm's variables (submitit's ``JobEnvironment``), exports the
torch.distributed variables for the arm (``CUDA_VISIBLE_DEVICES`` is left as Slurm set it) and
calls :func:`harness.launch.ranks.rank_main.run_rank`, which resumes after the last completed step.
Tasks beyond an arm's ranks (the one-rank reference arm) sit that arm out.

* An arm that is done (``completion.arm_needs_run`` with final outcomes kept: ``ok`` with every
  step on its ranks, ``failed``, ``timeout``, ``skipped`` at submit time) is skipped, so a
  requeued or retried job continues where the last one stopped.
* A start of a job Slurm requeued (``SLURM_RESTART_COUNT`` > 0: it ended the last start for a
  node failure or a preemption) runs again an arm that start recorded ``failed`` because a
  process died by Slurm's signal (:func:`killed_before_requeue`; the outcome is kept as
  ``outcome.infra-<n>.json``).
* An arm that raises on some rank gets a ``failed`` outcome with the traceback and its cause
  (``ExcType: message``, ``failures.log_cause``) and the job ends
  (srun ``--kill-on-bad-exit`` stops the other ranks; a crashed process cannot run more arms).
  A traceback that shows an infrastructure failure (a peer rank's connection dropped, an NCCL
  timeout: ``failures.infra_reason``) gives ``infra`` instead, which a requeue runs again.
* An arm running past ``case.resources.time_min`` gets a ``timeout`` outcome with the Python stacks
  of that rank, and the job ends.
* A command case (``command:``, ``launch.ranks.command``): each task starts its rank's process
  (``ranks: per_rank``, one task per rank) or its node's launcher (``launcher``, one task per
  node) with the job's rendezvous, after task 0 has cleaned the arm's metrics source; once every
  process has ended, task 0 reads the metrics into ``rank<k>.jsonl`` and writes the outcome
  (:func:`run_command_arm_in_job`). A process that cannot start or fails ends the job.
* Preemption or the time-limit warning (USR2): submitit calls :meth:`CaseJob.checkpoint` on rank 0
  and requeues the job; the next start resumes the arm in flight. ``SLURM_RESTART_COUNT`` becomes
  the outcome's ``restarts`` (plus the ``--retry-infra`` round).
* An emulated case's job has one task (``slurm.shape_of``): it runs each arm's emulated ranks as
  the local launcher does (``launch.ranks.emulated``: a process per rank, alone on one of the task's
  GPUs, side by side on several; on the CPU where the job has none and the case allows it), each
  rank with the arm's time limit; a requeued job runs only the ranks that lack steps.

Every line a rank prints during an arm is also appended to ``<arm>/log.txt`` as ``[rank k] ...``,
like the local launcher does. Rank 0 appends a typed event per arm start/end, each task one per
arm it starts (its node and host name) and each task of a command arm one per process end, to
``<case>/slurm_events.jsonl`` (``slurm.events``: job id, restart, the step it resumed after).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import importlib
import io
import os
import random
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, MutableMapping, Optional, TextIO, TypeVar

from harness.caseplan import CasePlan, PlannedArm
from harness.launch.ranks import rank_main
from harness.launch.ranks.arm_runner import leg_name, run_arm, run_legs
from harness.launch.ranks.command import (ArmCommand, Rendezvous, arm_command, failed_outcome,
                                          log_line, placeholder_values, prepare_metrics,
                                          process_label, record_environment, record_metrics,
                                          record_resumed, rendezvous_env, starters)
from harness.launch.ranks.command_resume import (Checkpointed, Leg, read_iteration_file,
                                                 resume_legs)
from harness.launch.ranks.completion import arm_needs_run
from harness.launch.ranks.emulated import EmulatedLauncher
from harness.launch.ranks.failures import ending_signal, infra_reason, log_cause, tail_text
from harness.launch.ranks.processes import (CPU_RANK_SETTINGS, RankCommand, cuda_device_count,
                                            rank_main_argv, run_ranks)
from harness.launch.ranks.variation import FIRST, VARIED, Variation, describe
from harness.launch.slurm.events import (ArmEnd, ArmStart, ProcessEnd, TaskStart, append_event,
                                         read_events)
from harness.metrics import source_mark
from harness.launch.sweep_folder import load_plan
from harness.results import (CASE_FILE, LOG_FILE, OUTCOME_FILE, ArmOutcome, read_outcome,
                             read_steps, write_outcome)

if TYPE_CHECKING:
    from submitit.core.utils import DelayedSubmission

TAIL_LINES = 60
TIMEOUT_EXIT_CODE = 124


@dataclass(frozen=True)
class TaskIdentity:
    """Who this task is in the job (from Slurm through submitit)."""

    job_id: str
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    restarts: int
    node: int = 0  # this task's node: its index in the job's node list
    host: str = dataclasses.field(default_factory=socket.gethostname)


def task_identity(environ: Optional[dict] = None) -> TaskIdentity:
    import submitit

    env = submitit.JobEnvironment()
    environ = os.environ if environ is None else environ
    return TaskIdentity(
        job_id=str(env.job_id), rank=env.global_rank, local_rank=env.local_rank,
        world_size=env.num_tasks, master_addr=env.hostnames[0],
        restarts=int(environ.get("SLURM_RESTART_COUNT", "0") or 0), node=env.node,
        host=socket.gethostname(),
    )


# Rendezvous ports come from below Linux's ephemeral range (32768-60999 by default), where
# outgoing connections on the node would otherwise take them at random.
PORT_RANGE = (20000, 32767)


def arm_port(job_id: str, arm: str, restarts: int) -> int:
    """Rendezvous port of one arm of one job start: every task computes the same number, and
    consecutive arms / restarts use different ports (no clash with a socket in TIME_WAIT)."""
    return random.Random(f"{job_id}/{arm}/{restarts}").randint(*PORT_RANGE)


def distributed_env(ident: TaskIdentity, port: int) -> dict[str, str]:
    """The torch.distributed variables of this task. CUDA_VISIBLE_DEVICES is not among them."""
    return {
        "RANK": str(ident.rank), "WORLD_SIZE": str(ident.world_size),
        "LOCAL_RANK": str(ident.local_rank), "MASTER_ADDR": ident.master_addr,
        "MASTER_PORT": str(port),
    }


class _TeeLines(io.TextIOBase):
    """Writes to ``stream`` and appends each complete line, prefixed, to ``path`` (O_APPEND)."""

    def __init__(self, stream: TextIO, path: Path, prefix: str) -> None:
        self._stream = stream
        self._fd: Optional[int] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._prefix = prefix
        self._partial = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._stream.write(text)
        with self._lock:
            data = self._partial + text
            *lines, self._partial = data.split("\n")
            if lines and self._fd is not None:
                os.write(self._fd, "".join(f"{self._prefix}{ln}\n" for ln in lines).encode())
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def close(self) -> None:
        with self._lock:
            if self._fd is None:
                return
            if self._partial:
                os.write(self._fd, f"{self._prefix}{self._partial}\n".encode())
                self._partial = ""
            os.close(self._fd)
            self._fd = None
        super().close()


class _ArmWatchdog:
    """Ends this task when one arm runs past its limit: stacks to the log, a timeout outcome,
    exit code 124 (srun then stops the other tasks)."""

    def __init__(self, limit_s: float, arm_dir: Path, ident: TaskIdentity, started: float,
                 repro: str) -> None:
        self._timer = threading.Timer(limit_s, self._fire)
        self._timer.daemon = True
        self._limit_s = limit_s
        self._arm_dir = arm_dir
        self._ident = ident
        self._started = started
        self._repro = repro

    def __enter__(self) -> "_ArmWatchdog":
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def _fire(self) -> None:
        stacks = self._arm_dir / f"stacks.rank{self._ident.rank}.txt"
        with open(stacks, "w", encoding="utf-8") as fh:
            faulthandler.dump_traceback(file=fh, all_threads=True)
        write_outcome(self._arm_dir, ArmOutcome(
            status="timeout", returncode=TIMEOUT_EXIT_CODE,
            wall_s=round(time.monotonic() - self._started, 3),
            log_tail=tail_text(self._arm_dir / LOG_FILE, TAIL_LINES) + "\n--- Python stacks (rank "
            f"{self._ident.rank}) ---\n" + tail_text(stacks, 80),
            repro=self._repro, restarts=self._ident.restarts,
            detail=f"rank {self._ident.rank} ran past the arm limit of {self._limit_s:.0f}s "
                   f"(slurm job {self._ident.job_id})"))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(TIMEOUT_EXIT_CODE)


def raised_outcome(exc: BaseException, tb: str, ident: TaskIdentity, arm_dir: Path, repro: str,
                   wall_s: float) -> ArmOutcome:
    """The outcome of an arm whose rank raised: ``infra`` when the traceback shows an
    infrastructure failure (a peer's connection dropped, an NCCL timeout: the job's requeue or
    ``--retry-infra`` runs the arm again), else ``failed``."""
    reason = infra_reason(tb)
    because = f"; {reason}" if reason else ""
    return ArmOutcome(
        status="infra" if reason else "failed", returncode=1, wall_s=wall_s,
        log_tail=tail_text(arm_dir / LOG_FILE, TAIL_LINES), repro=repro, restarts=ident.restarts,
        detail=f"rank {ident.rank} raised {type(exc).__name__} (slurm job {ident.job_id}{because})",
        cause=log_cause(tb))


def _sit_out(arm_dir: Path, limit_s: float, poll_s: float = 2.0) -> None:
    """A task beyond an arm's ranks waits for rank 0 to finish that arm (its outcome.json)
    before the next arm, which all tasks run again; bounded by the arm's time limit."""
    deadline = time.monotonic() + limit_s
    while not (Path(arm_dir) / OUTCOME_FILE).is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{arm_dir}: rank 0 did not finish this arm within {limit_s:.0f} s")
        time.sleep(poll_s)


# Variables Slurm sets in a task that was given GPUs (``--gpus-per-node``, ``--gres``).
_GPU_TASK_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS")


def pin_cpu_task(environ: MutableMapping[str, str]) -> None:
    """A task without GPUs runs built-in CPU ranks: give them what the local launcher gives its CPU
    ranks (``processes.CPU_RANK_SETTINGS``: one intra-op thread, MKL's COMPATIBLE branch), where
    the job's environment does not set them, so golden values are judged bitwise here too."""
    if not any(environ.get(name) for name in _GPU_TASK_VARS):
        for key, value in CPU_RANK_SETTINGS.items():
            environ.setdefault(key, value)


def run_case_arms(plan: CasePlan, case_dir: Path, ident: TaskIdentity, retry_round: int = 0) -> dict:
    """Run every planned arm of the case that still needs it (``completion.arm_needs_run``, final
    outcomes kept) through this task's :class:`TaskLauncher` (see module doc)."""
    case_dir = Path(case_dir)
    # Load the workload (torch) before any arm's clock starts: the per-arm limit is for training,
    # not for this task's one-off imports (harness.workload loads lazily).
    if plan.case.command is None:
        pin_cpu_task(os.environ)  # before torch loads MKL
        importlib.import_module("harness.workload.train")
    launcher = TaskLauncher(dataclasses.replace(ident, restarts=ident.restarts + retry_round))
    ran, skipped = [], []
    for arm in plan.arms:
        arm_dir = case_dir / arm.name
        killed = killed_before_requeue(case_dir, arm, ident, launcher.ident.restarts)
        if killed is not None and ident.rank == 0:
            set_aside_killed(arm_dir, killed)
        if killed is None and not arm_needs_run(arm, arm_dir, retry_final=False):
            skipped.append(arm.name)
            continue
        arm_dir.mkdir(parents=True, exist_ok=True)
        launcher.run_arm(plan, arm, arm_dir, case_dir / CASE_FILE)
        (ran if launcher.takes_part(plan, arm) else skipped).append(arm.name)
    return {"case": plan.case_id, "rank": launcher.ident.rank, "ran": ran, "skipped": skipped}


def killed_before_requeue(case_dir: Path, arm: PlannedArm, ident: TaskIdentity,
                          restarts: int) -> Optional[ArmOutcome]:
    """The ``failed`` outcome of ``arm`` that an earlier start of this very job wrote because a
    process died by the signal with which Slurm ended that start (a node failure, a preemption),
    in a start Slurm then requeued (``SLURM_RESTART_COUNT`` > 0): the signal was Slurm's, so
    the arm runs again (None: the outcome stands). Every task decides from the same files: the
    outcome, and the arm's events (one of this job's id from an earlier start than
    ``restarts``, this start's count with the ``--retry-infra`` round: the arm ran in it; a job
    that skipped an arm writes none of its events)."""
    if ident.restarts == 0:
        return None
    outcome = read_outcome(case_dir / arm.name)
    if outcome is None or outcome.status != "failed" or ending_signal(outcome.returncode) is None:
        return None
    ran = any(e.arm == arm.name and e.job_id == ident.job_id and e.restarts < restarts
              for e in read_events(case_dir))
    return outcome if ran else None


def set_aside_killed(arm_dir: Path, outcome: ArmOutcome) -> None:
    """Keep a killed arm's outcome as ``outcome.infra-<n>.json`` (as ``--retry-infra`` keeps
    an infra one) and say in its log that it runs again."""
    arm_dir = Path(arm_dir)
    n = len(list(arm_dir.glob("outcome.infra-*.json")))
    write_outcome(arm_dir, dataclasses.replace(outcome, status="infra", detail=(
        f"Slurm ended and requeued the job while the arm ran: {outcome.detail}")))
    (arm_dir / OUTCOME_FILE).rename(arm_dir / f"outcome.infra-{n}.json")
    with open(arm_dir / LOG_FILE, "a", encoding="utf-8") as log:
        log.write(f"[launcher] Slurm requeued the job after ending it while this arm ran (its "
                  f"process died by signal {ending_signal(outcome.returncode)}: {outcome.detail}); "
                  "running it again\n")


@dataclass(frozen=True)
class TaskLauncher:
    """The launcher (``launch.arm_launcher.ArmLauncher``) of one task of a Slurm job: its share of an
    arm (its rank of a built-in arm, its process of a command arm, every rank of an emulated arm
    on task 0), or, for a task beyond the arm's, sitting the arm out until task 0 wrote the
    arm's outcome. ``run_arm`` returns the arm's outcome as this task knows it, and raises when
    the arm failed here: the job ends (srun stops the other tasks)."""

    ident: TaskIdentity
    python: str = sys.executable  # the interpreter the repro line names

    def takes_part(self, plan: CasePlan, arm: PlannedArm) -> bool:
        """Whether this task runs a share of ``arm``."""
        if plan.case.command is not None:
            return self.ident.rank < starters(plan, arm)
        if arm.emulated:  # an emulated case's job has one task; any other sits it out
            return self.ident.rank == 0
        return self.ident.rank < arm.world_size  # the reference arm runs fewer ranks than the job

    def run_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
                case_json: Path) -> ArmOutcome:
        """This task's share of ``arm`` (``arm_runner.run_arm``: this task is the place), after
        its ``task_start`` event (which node and host it runs on)."""
        append_event(Path(arm_dir).parent, TaskStart(**_stamp(self.ident, arm), task=self.ident.rank,
                                                     node=self.ident.node, host=self.ident.host))
        return run_arm(self, plan, arm, arm_dir, case_json)

    # ------------------------------------------------------------ the place (arm_runner.ArmPlace)
    def before(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path) -> Optional[ArmOutcome]:
        """A task beyond the arm's sits it out until task 0 wrote the arm's outcome: that one."""
        if self.takes_part(plan, arm):
            return None
        limit_s = 60.0 * plan.case.resources.time_min
        _sit_out(arm_dir, limit_s * (len(arm.ranks) if arm.emulated else 1) + 120.0)
        return _written_outcome(arm_dir)

    def command_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
                    repro: str) -> ArmOutcome:
        return run_command_arm_in_job(plan, arm, arm_dir.parent, self.ident, repro)

    def emulated_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path, case_json: Path,
                     repro: str) -> ArmOutcome:
        return run_emulated_arm_in_job(plan, arm, arm_dir.parent, self.ident)

    def builtin_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path, case_json: Path,
                    repro: str) -> ArmOutcome:
        return run_rank_in_job(plan, arm, arm_dir.parent, self.ident, repro)


def _written_outcome(arm_dir: Path) -> ArmOutcome:
    outcome = read_outcome(arm_dir)
    if outcome is None:
        raise RuntimeError(f"{arm_dir}: the arm's outcome.json is gone")
    return outcome


def run_rank_in_job(plan: CasePlan, arm: PlannedArm, case_dir: Path, ident: TaskIdentity,
                    repro: str) -> ArmOutcome:
    """This task's rank of the built-in ``arm``, in this process (``rank_main.run_rank``, resuming
    after the last completed step), its output teed into the arm's log, within the arm's limit
    (:class:`_ArmWatchdog`); task 0 records the arm's start, end and outcome. A raising rank
    writes the arm's outcome (the first to fail) and raises (module doc)."""
    arm_dir = case_dir / arm.name
    if ident.rank == 0:
        (arm_dir / OUTCOME_FILE).unlink(missing_ok=True)  # no stale outcome in flight
        done = read_steps(arm_dir).get(0, [])
        append_event(case_dir, ArmStart(**_stamp(ident, arm), resumed_after_step=len(done)))
    arm_ident = dataclasses.replace(ident, world_size=arm.world_size)
    started = time.monotonic()
    out, err = sys.stdout, sys.stderr
    tee_out = _TeeLines(out, arm_dir / LOG_FILE, f"[rank {ident.rank}] ")
    tee_err = _TeeLines(err, arm_dir / LOG_FILE, f"[rank {ident.rank}] ")
    sys.stdout, sys.stderr = tee_out, tee_err
    try:
        with _ArmWatchdog(60.0 * plan.case.resources.time_min, arm_dir, ident, started, repro):
            # An interrupted arm (compare.resume) runs in two legs: the first stops after its
            # step and tears its process group down, the second resumes from the checkpoint,
            # each leg on a port of its own.
            def leg(index: int, stop: Optional[int]) -> ArmOutcome:
                os.environ.update(distributed_env(arm_ident, arm_port(
                    ident.job_id, leg_name(arm, index), ident.restarts)))
                if arm.case.execution.vary_processes:
                    run_varied_rank(arm, arm_dir, ident.rank, stop)
                else:
                    rank_main.run_rank(arm, arm_dir, resume=True, stop_after=stop)
                return ArmOutcome(status="ok")  # a leg that fails raises

            run_legs(arm, leg)
    except Exception as exc:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        if read_outcome(arm_dir) is None:  # the first failing rank is usually the cause
            write_outcome(arm_dir, raised_outcome(exc, tb, ident, arm_dir, repro,
                                                  round(time.monotonic() - started, 3)))
        raise
    finally:
        sys.stdout, sys.stderr = out, err
        tee_out.close()
        tee_err.close()
    wall = round(time.monotonic() - started, 3)
    outcome = ArmOutcome(status="ok", returncode=0, wall_s=wall, repro=repro,
                         restarts=ident.restarts, detail=f"slurm job {ident.job_id}")
    if ident.rank == 0:
        if read_outcome(arm_dir) is None:
            write_outcome(arm_dir, outcome)
        append_event(case_dir, ArmEnd(**_stamp(ident, arm), wall_s=wall))
    return outcome


# A varied start inside a Slurm task: srun starts the tasks, so their order is Slurm's.
IN_JOB_VARIATION: Variation = dataclasses.replace(VARIED, last_rank_first=False)


def in_job_variation(arm: PlannedArm) -> Variation:
    """How this task starts its process of ``arm``: varied where its case says
    ``execution.vary_processes`` (all of ``launch.ranks.variation`` but the start order)."""
    return IN_JOB_VARIATION if arm.case.execution.vary_processes else FIRST


def run_varied_rank(arm: PlannedArm, arm_dir: Path, rank: int, stop: Optional[int],
                    variation: Variation = IN_JOB_VARIATION) -> None:
    """This task's rank of an arm whose case says ``execution.vary_processes`` (the repeat and
    reference arms) in a process of its own, started as ``launch.ranks.variation`` varies it:
    another hash seed, its own working and temporary folders, the environment reversed, a cold
    interpreter. The task's own process runs every other arm with one hash seed, so running
    this arm in it would vary nothing. The rank's output goes to this task's (teed) stdout; a
    rank that fails raises."""
    argv = [*rank_main_argv(sys.executable, Path(arm_dir).parent / CASE_FILE, arm.name, arm_dir),
            *(("--stop-after", str(stop)) if stop is not None else ())]
    print(f"[launcher] rank {rank} of arm '{arm.name}': {describe(variation)}", flush=True)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env=variation.environment(os.environ, arm_dir),
                            cwd=variation.cwd(arm_dir, None))
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
    code = proc.wait()
    sys.stdout.flush()
    if code != 0:
        raise RuntimeError(f"arm '{arm.name}': rank {rank}'s process ({describe(variation)}) "
                           f"exited with code {code}")


def _stamp(ident: TaskIdentity, arm: PlannedArm) -> dict:
    """What every event of ``arm`` in this start of the job says (``slurm.events``)."""
    return dict(arm=arm.name, job_id=ident.job_id, restarts=ident.restarts, time=time.time())


_E = TypeVar("_E", ArmStart, ProcessEnd, ArmEnd)


def _arm_events(case_dir: Path, kind: type[_E], arm: PlannedArm, ident: TaskIdentity,
                leg: int = 0) -> list[_E]:
    """The events of type ``kind`` of ``arm`` in this start of the job (of run ``leg`` of a
    resumed command arm: events of its first run name none)."""
    return [e for e in read_events(case_dir) if isinstance(e, kind) and e.arm == arm.name
            and e.job_id == ident.job_id and e.restarts == ident.restarts
            and (getattr(e, "leg", None) or 0) == leg]


def _wait_for(what: str, ready: Callable[[], bool], limit_s: float, poll_s: float = 0.5) -> None:
    deadline = time.monotonic() + limit_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {limit_s:.0f} s")
        time.sleep(poll_s)


def run_command_arm_in_job(plan: CasePlan, arm: PlannedArm, case_dir: Path,
                           ident: TaskIdentity, repro: str) -> ArmOutcome:
    """This task's process of the command arm ``arm`` (``launch.ranks.command``): its rank
    (``ranks: per_rank``, one task per rank) or its node's launcher (``launcher``, one task per
    node), started once task 0 has cleaned the metrics source (its ``arm_start`` event), with the
    job's rendezvous. Each task appends a ``process_end`` event; a process that cannot start or
    fails gets the arm's outcome (the first to fail) and ends the job, as a raising built-in rank
    does. Task 0 waits for every process's end, then reads the metrics into ``rank<k>.jsonl``
    (``command.record_metrics``) and writes the outcome; the other tasks wait for it. A
    ``-resumed`` arm (``launch.ranks.command_resume``) runs twice: the events of its second run
    say ``leg: 1``, which task 0 starts once every process of the first ended (the source marked
    and the iteration file read between them). The arm's outcome."""
    arm_dir = case_dir / arm.name
    limit_s = 60.0 * plan.case.resources.time_min
    spec = plan.case.command.metrics  # type: ignore[union-attr]
    legs: list[Leg] = []
    loaded = Checkpointed()
    log_start, outcome = 0, ArmOutcome(status="ok")
    for index, leg in enumerate(resume_legs(arm)):
        cmd = arm_command(plan, arm, arm_dir, _leg_place(ident, arm, index), {}, leg)
        since = None
        if ident.rank == 0:
            if index == 0:
                (arm_dir / OUTCOME_FILE).unlink(missing_ok=True)  # no stale outcome in flight
                log_start = prepare_metrics(plan, arm, arm_dir, cmd.metrics_path)
                record_environment(plan, arm_dir, cmd)
            else:
                loaded = read_iteration_file(plan, placeholder_values(plan, arm, arm_dir))
            if leg is not None:
                log_line(arm_dir, _leg_line(arm, leg, loaded))
                since = source_mark(spec, arm_dir, cmd.metrics_path, arm.ranks)
            append_event(case_dir, ArmStart(**_stamp(ident, arm), processes=starters(plan, arm),
                                            leg=index or None))
        else:
            _wait_for(f"task 0 starting arm '{arm.name}'", lambda: bool(
                _arm_events(case_dir, ArmStart, arm, ident, index)), limit_s)
        outcome = _run_process(plan, arm, case_dir, ident, cmd, repro, limit_s, index)
        if ident.rank == 0:
            _wait_for(f"every process of arm '{arm.name}' ending", lambda: len(
                {e.process for e in _arm_events(case_dir, ProcessEnd, arm, ident, index)})
                == starters(plan, arm), limit_s + 120.0)
            bad = [e for e in _arm_events(case_dir, ProcessEnd, arm, ident, index)
                   if e.status != "ok"]
            if bad:
                raise RuntimeError(f"arm '{arm.name}': process {bad[0].process} {bad[0].status}")
            if since is not None:
                legs.append(Leg(outcome, since, source_mark(spec, arm_dir, cmd.metrics_path,
                                                            arm.ranks)))
    if ident.rank != 0:
        _sit_out(arm_dir, limit_s + 120.0)  # task 0 records the metrics, then the next arm
        return _written_outcome(arm_dir)
    on_cuda = cuda_device_count() > 0
    if legs:
        outcome = record_resumed(plan, arm, arm_dir, legs, loaded, cmd.metrics_path, on_cuda,
                                 cmd=cmd)
        outcome = dataclasses.replace(outcome, detail=f"{outcome.detail} (slurm job "
                                                      f"{ident.job_id})")
    else:
        outcome = record_metrics(plan, arm, arm_dir, outcome, cmd.metrics_path, log_start,
                                 on_cuda=on_cuda, cmd=cmd)
    write_outcome(arm_dir, outcome)
    append_event(case_dir, ArmEnd(**_stamp(ident, arm), status=outcome.status,
                                  wall_s=outcome.wall_s))
    return outcome


def _leg_place(ident: TaskIdentity, arm: PlannedArm, index: int) -> Rendezvous:
    """The job's rendezvous of one run of ``arm`` (a resumed arm's second run: another port)."""
    name = arm.name if index == 0 else f"{arm.name}/leg{index}"
    return Rendezvous(ident.master_addr, arm_port(ident.job_id, name, ident.restarts),
                      ident.rank, ident.local_rank)


def _leg_line(arm: PlannedArm, leg: str, loaded: Checkpointed) -> str:
    """The log line that starts one run of a ``-resumed`` arm."""
    if leg == "save":
        return (f"arm {arm.name}: first run (command.resume.save): saving after step "
                f"{arm.case.execution.interrupt_after}, then exit")
    said = (f"the iteration file names step {loaded.step}" if loaded.step is not None
            else loaded.problem or "the case names no iteration file")
    return f"arm {arm.name}: second run (command.resume.load): loading the checkpoint; {said}"


def _run_process(plan: CasePlan, arm: PlannedArm, case_dir: Path, ident: TaskIdentity,
                 cmd: ArmCommand, repro: str, limit_s: float, index: int) -> ArmOutcome:
    """Run this task's process of one run of ``arm`` and append its ``process_end``; a process
    that cannot start or fails writes the arm's outcome (the first to fail) and raises."""

    arm_dir = case_dir / arm.name
    place = _leg_place(ident, arm, index)
    outcome = (failed_outcome(arm, arm_dir, cmd.problem, repro) if cmd.problem else run_ranks(
        RankCommand(argv=cmd.argv, world_size=starters(plan, arm), arm_dir=arm_dir,
                    timeout_s=limit_s, env=cmd.env, repro=repro, ranks=(ident.rank,),
                    cwd=cmd.cwd, redact=cmd.secrets, label=process_label(plan),
                    rendezvous=rendezvous_env(plan, arm, place),
                    variation=in_job_variation(arm)),
        port_retries=0))
    outcome = dataclasses.replace(outcome, restarts=ident.restarts, detail=(
        f"{outcome.detail} (slurm job {ident.job_id})" if outcome.detail
        else f"slurm job {ident.job_id}"))
    append_event(case_dir, ProcessEnd(**_stamp(ident, arm), process=ident.rank,
                                      status=outcome.status, leg=index or None))
    if not outcome.ok:
        if read_outcome(arm_dir) is None:  # the first failing process is usually the cause
            write_outcome(arm_dir, outcome)
        raise RuntimeError(f"arm '{arm.name}' process {ident.rank}: {outcome.describe()}")
    return outcome


def run_emulated_arm_in_job(plan: CasePlan, arm: PlannedArm, case_dir: Path,
                            ident: TaskIdentity) -> ArmOutcome:
    """Run the emulated ``arm`` on this task's GPUs (``emulated.EmulatedLauncher``), record its
    outcome and the arm's start and end events."""
    arm_dir = case_dir / arm.name
    (arm_dir / OUTCOME_FILE).unlink(missing_ok=True)  # no stale outcome in flight
    append_event(case_dir, ArmStart(
        **_stamp(ident, arm), emulated=tuple(arm.ranks),
        recorded_steps={str(r): len(v) for r, v in read_steps(arm_dir).items()}))
    started = time.monotonic()
    outcome = EmulatedLauncher(cuda_device_count(), 60.0 * plan.case.resources.time_min).run_arm(
        plan, arm, arm_dir, case_dir / CASE_FILE)
    outcome = dataclasses.replace(outcome, restarts=ident.restarts,
                                  detail=f"{outcome.detail} (slurm job {ident.job_id})")
    write_outcome(arm_dir, outcome)
    append_event(case_dir, ArmEnd(**_stamp(ident, arm), status=outcome.status,
                                  wall_s=round(time.monotonic() - started, 3)))
    return outcome


@dataclass(frozen=True)
class CaseJob:
    """The submitit callable of one case (picklable): its folder on the shared filesystem, whose
    ``case.json`` and ``plan.json`` the job reads (checked against each other by their hash)."""

    case_dir: str
    retry_round: int = 0

    def __call__(self) -> dict:
        plan = load_plan(Path(self.case_dir))
        return run_case_arms(plan, Path(self.case_dir), task_identity(), self.retry_round)

    def checkpoint(self) -> "DelayedSubmission":
        """Called by submitit on rank 0 at preemption / time-limit warning: requeue the same
        job. Progress lives in the case folder (steps + checkpoints), so nothing else to save."""
        from submitit.core.utils import DelayedSubmission

        return DelayedSubmission(self)
