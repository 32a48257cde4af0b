"""Run one arm of a case on this machine: one process per rank.

Ranks rendezvous over TCP on 127.0.0.1 at a port picked by binding port 0 (retried on a fresh port
when a rank reports "address already in use"). Every arm of a case trains on CUDA (NCCL) when
this machine has a CUDA GPU for every rank of the case's largest arm, otherwise on CPU (gloo; GPUs
hidden from the ranks); a case that needs CUDA and cannot have it here is skipped with the reason
(``placement``). Every line a rank prints goes to ``<arm_dir>/log.txt`` prefixed with ``[rank k]``.
An arm of an emulated case runs each of its ranks alone in a process of its own (``emulated.py``).

A rank that exits non-zero fails the arm (``infra`` instead when ``failures.classify_exit`` sees an
infrastructure failure: killed by SIGKILL, an NCCL timeout, a peer's dropped connection in its
output; the same rule as under Slurm); an arm past its time limit times out. Either way the ranks
still alive get SIGUSR1 first (``rank_main`` dumps their Python stacks to ``stacks.rank<k>.txt``),
then their process groups are terminated (SIGTERM, then SIGKILL); stack files left empty are
removed. The outcome carries the log tail, those stacks, a one-line repro command and the cause the
failing rank's log names (``failures.rank_cause``: ``ExcType: message``). Nothing here raises for a
failing arm.

    python -m harness.launch.local --case CASE_JSON --arm NAME --out ARM_DIR [--timeout-min M]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Deque, Mapping, Optional, Sequence, Union

from harness.caseplan import CasePlan, PlannedArm
from harness.errors import ConfigError
from harness.launch.emulated import EmulatedLauncher
from harness.launch.failures import classify_exit, rank_cause, tail_text
from harness.launch.command import run_command_arm
from harness.launch.placement import runs_on_cuda, skip_reason
from harness.launch.ports import is_addr_in_use, pick_free_port
from harness.launch.rank_main import (LAUNCHER_PID_ENV, arm_legs, read_plan_beside,
                                      remove_empty_stacks, stacks_path)
from harness.launch.repro import REPO_ROOT, repro_line
from harness.launch.warm import WarmProcess, WarmStarter
from harness.results import CASE_FILE, LOG_FILE, ArmOutcome, read_steps, write_outcome

TAIL_LINES = 60
STACK_LINES = 80


@dataclass(frozen=True)
class ProcessStart:
    """One process's own argument vector and rendezvous variables (``RankCommand.per_process``)."""

    argv: tuple[str, ...]
    rendezvous: Mapping[str, str]


@dataclass(frozen=True)
class RankCommand:
    """What to spawn for every rank of one arm (the rank environment is added per rank).

    ``ranks``: the ranks to start (default: every rank of ``world_size``, rendezvous over TCP).
    ``emulated``: each of them runs alone (``argv`` + ``--emulate-rank R``, no rendezvous), on the
    GPU ``devices[R]`` names (its ``CUDA_VISIBLE_DEVICES``) where given."""

    argv: tuple[str, ...]
    world_size: int
    arm_dir: Path
    timeout_s: float
    env: Mapping[str, str] = field(default_factory=dict)
    repro: str = ""
    ranks: tuple[int, ...] = ()
    emulated: bool = False
    devices: Mapping[int, str] = field(default_factory=dict)
    cwd: Optional[Path] = None  # where the ranks start (a command case's working folder)
    stop: Optional[threading.Event] = None  # set: end the ranks and raise KeyboardInterrupt
    # Set by another launcher (Slurm) or a command case's launcher: replaces the rendezvous
    # variables above (a MASTER_PORT here is fixed: never retried on another port).
    rendezvous: Mapping[str, str] = field(default_factory=dict)
    redact: tuple[str, ...] = ()  # values (secrets) printed as *** in the log and the tail
    # Processes whose argument vector and rendezvous differ from ``argv`` / ``rendezvous`` (a
    # command case's launchers on one machine, one per node: each its own ``{node_rank}``).
    per_process: Mapping[int, "ProcessStart"] = field(default_factory=dict)

    @property
    def started(self) -> tuple[int, ...]:
        """The ranks this command starts."""
        return self.ranks or tuple(range(self.world_size))

    def argv_of(self, rank: int) -> list[str]:
        if rank in self.per_process:
            return list(self.per_process[rank].argv)
        return list(self.argv) + (["--emulate-rank", str(rank)] if self.emulated else [])

    def env_of(self, base: Mapping[str, str], rank: int, port: int) -> dict[str, str]:
        if not self.emulated:
            rendezvous = (self.per_process[rank].rendezvous if rank in self.per_process
                          else self.rendezvous)
            return {**rank_env(base, rank, self.world_size, port, self.env), **rendezvous}
        extra = dict(self.env)
        if rank in self.devices:
            extra["CUDA_VISIBLE_DEVICES"] = self.devices[rank]
        return alone_env(base, extra)


@dataclass
class _Rank:
    """A running rank (mutable: its reader thread records when its output ended)."""

    rank: int
    proc: Union[subprocess.Popen, WarmProcess]
    tail: Deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    reader: Optional[threading.Thread] = None
    output_closed_at: Optional[float] = None  # ~ when it exited; orders simultaneous failures


# --------------------------------------------------------------------------- helpers
def cuda_device_count() -> int:
    """CUDA GPUs visible to this process (0 without CUDA); does not create a CUDA context."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_env(world_size: int, gpus: int, case_world: Optional[int] = None
               ) -> tuple[dict[str, str], str]:
    """Extra environment for the ranks of an arm of ``world_size`` ranks, and a line saying where
    they run: CUDA when there is a GPU for each of the ``case_world`` ranks of the case's largest
    arm (default: this arm's), so every arm of a case runs on the same kind of device."""
    need = max(world_size, case_world or 0)
    if gpus >= need:
        return {}, f"{world_size} rank(s) on CUDA (NCCL), {gpus} GPU(s) visible"
    if gpus == 0:
        why = "no CUDA GPU"
    elif need > world_size:
        why = (f"{gpus} CUDA GPU(s) < {need} ranks of the case's largest arm (every arm of a case "
               "runs on one kind of device)")
    else:
        why = f"{gpus} CUDA GPU(s) < {world_size} ranks"
    return {"CUDA_VISIBLE_DEVICES": ""}, f"{world_size} rank(s) on CPU (gloo): {why}"


def rank_env(base: Mapping[str, str], rank: int, world_size: int, port: int,
             extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update(extra)
    env.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        PYTHONUNBUFFERED="1", **{LAUNCHER_PID_ENV: str(os.getpid())},
    )
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    if env.get("CUDA_VISIBLE_DEVICES") == "":  # CPU ranks: OpenMP threads wait asleep, not
        # spinning; on cores shared with other processes spinning slowed steps 10-30x
        # (bench/arm_phases.py). The thread count, hence every figure, stays the same.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    path = env.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in path.split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)
    return env


def alone_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of an emulated rank's process: no rendezvous (no RANK or MASTER_*)."""
    env = {k: v for k, v in base.items() if k not in _RENDEZVOUS}
    env.update(extra)
    env.update(PYTHONUNBUFFERED="1", **{LAUNCHER_PID_ENV: str(os.getpid())})
    path = env.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in path.split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)
    return env


# SIGKILL takes effect at once: a killed rank not reaped after this long cannot be waited for.
_REAP_AFTER_KILL_S = 10.0
_RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _pump(r: _Rank, log: IO[str], lock: threading.Lock, redact: tuple[str, ...]) -> None:
    stream = r.proc.stdout
    assert stream is not None
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        for secret in redact:
            line = line.replace(secret, "***")
        r.tail.append(line)
        with lock:
            log.write(f"[rank {r.rank}] {line}\n")
            log.flush()
    r.output_closed_at = time.monotonic()
    stream.close()


def _signal_group(proc: Union[subprocess.Popen, WarmProcess], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _steps_recorded(arm_dir: Path) -> int:
    return sum(len(records) for records in read_steps(arm_dir).values())


# --------------------------------------------------------------------------- the process group
def run_ranks(cmd: RankCommand, *, stack_wait_s: float = 3.0, kill_grace_s: float = 5.0,
              port_retries: int = 3, poll_s: float = 0.05,
              starter: Optional[WarmStarter] = None) -> ArmOutcome:
    """Spawn ``cmd.world_size`` processes of ``cmd.argv`` and wait for them (see module doc);
    ``starter``: fork them from its warm servers where it can (``harness.launch.warm``)."""
    arm_dir = Path(cmd.arm_dir)
    arm_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    restarts = 0
    with open(arm_dir / LOG_FILE, "a", encoding="utf-8") as log:
        fixed = cmd.rendezvous.get("MASTER_PORT")
        while True:
            port = int(fixed) if fixed else pick_free_port()
            steps_before = _steps_recorded(arm_dir)
            outcome, attempt_text = _attempt(cmd, port, log, started, stack_wait_s, kill_grace_s,
                                             poll_s, starter)
            # Only a rendezvous failure (no step made) is retried on another port.
            retry = (not fixed and outcome.status in ("failed", "infra") and restarts < port_retries
                     and is_addr_in_use(attempt_text) and _steps_recorded(arm_dir) == steps_before)
            if not retry:
                break
            restarts += 1
            log.write(f"[launcher] port {port} was taken; retrying on a fresh port "
                      f"({restarts}/{port_retries})\n")
            log.flush()
    return ArmOutcome(
        status=outcome.status, returncode=outcome.returncode,
        wall_s=round(time.monotonic() - started, 3), log_tail=outcome.log_tail,
        repro=cmd.repro, restarts=restarts, detail=outcome.detail, cause=outcome.cause,
    )


def _spawn(cmd: RankCommand, rank: int, port: int, starter: Optional[WarmStarter]
           ) -> tuple[Union[subprocess.Popen, WarmProcess], Optional[str]]:
    """Rank ``rank``'s process: forked warm by ``starter`` where it can, else started cold (and
    why, when a warm start was refused)."""
    argv, env = cmd.argv_of(rank), cmd.env_of(os.environ, rank, port)
    why = None
    if starter is not None:
        proc, why = starter.start(argv, env, str(cmd.cwd) if cmd.cwd is not None else None)
        if proc is not None:
            return proc, None
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, env=env,
                            cwd=cmd.cwd), why


def _attempt(cmd: RankCommand, port: int, log: IO[str], started: float, stack_wait_s: float,
             kill_grace_s: float, poll_s: float, starter: Optional[WarmStarter] = None
             ) -> tuple[ArmOutcome, str]:
    arm_dir = Path(cmd.arm_dir)
    for k in cmd.started:
        stacks_path(arm_dir, k).unlink(missing_ok=True)
    lock = threading.Lock()
    how = (f"emulated rank(s) {', '.join(map(str, cmd.started))} of {cmd.world_size}, each alone"
           if cmd.emulated else f"x{cmd.world_size} port {port}")
    log.write(f"[launcher] {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} "
              f"{shlex.join(cmd.argv)} {how} timeout {cmd.timeout_s:.0f}s\n")
    log.flush()
    ranks: list[_Rank] = []
    try:
        for k in cmd.started:
            proc, cold_why = _spawn(cmd, k, port, starter)
            if cold_why is not None:
                with lock:
                    log.write(f"[launcher] rank {k} started cold: {cold_why}\n")
                    log.flush()
            r = _Rank(k, proc)
            r.reader = threading.Thread(target=_pump, args=(r, log, lock, cmd.redact),
                                        daemon=True)
            r.reader.start()
            ranks.append(r)
        status, detail, returncode, culprit = _wait(ranks, started + cmd.timeout_s, poll_s,
                                                    cmd.timeout_s, cmd.stop)
        hung = [r for r in ranks if r.proc.poll() is None]
        stacks = _dump_stacks(hung, arm_dir, stack_wait_s) if hung else ""
    finally:
        _terminate([r for r in ranks if r.proc.poll() is None], kill_grace_s)
        for r in ranks:  # whatever a rank left behind in its process group (workers, children)
            _signal_group(r.proc, signal.SIGKILL)
        for r in ranks:
            if r.reader is not None:
                r.reader.join(timeout=5)
        # A rank ended by a signal (SIGTERM above, Ctrl-C of the sweep) leaves its stack file empty.
        remove_empty_stacks(arm_dir, cmd.started)
    if status == "ok":
        return ArmOutcome(status="ok", returncode=0, detail=detail), ""
    with lock:
        log.flush()
    cause = ""
    if culprit is not None:  # the failing rank's own output, not drowned by its siblings'
        cause = rank_cause(arm_dir / LOG_FILE, culprit)
        lines = next(r.tail for r in ranks if r.rank == culprit)
        tail = f"--- last lines of rank {culprit} ---\n" + "\n".join(lines)
        infra = classify_exit(-returncode if returncode is not None and returncode < 0 else None,
                              "\n".join(lines))
        if infra is not None:  # the reason belongs to the failing rank, said before the others
            status, detail = infra.status, f"{detail}: {infra.reason}"
    else:
        tail = tail_text(arm_dir / LOG_FILE, TAIL_LINES)
    if hung:
        detail += (f"; the launcher then stopped rank(s) {', '.join(str(r.rank) for r in hung)}, "
                   "still running")
    if stacks:
        tail += "\n--- Python stacks of the ranks still running (SIGUSR1) ---\n" + stacks
    attempt_text = "\n".join(line for r in ranks for line in r.tail)
    return (ArmOutcome(status=status, returncode=returncode, log_tail=tail, detail=detail,
                       cause=cause), attempt_text)


def _wait(ranks: list[_Rank], deadline: float, poll_s: float, timeout_s: float,
          stop: Optional[threading.Event] = None) -> tuple[str, str, Optional[int], Optional[int]]:
    """(status, detail, returncode, failing rank) once all ranks exit 0, one fails, or time is up;
    KeyboardInterrupt once ``stop`` is set (the sweep was interrupted in another thread)."""
    while True:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        codes = [r.proc.poll() for r in ranks]
        bad = [(r.rank, c) for r, c in zip(ranks, codes) if c not in (None, 0)]
        if bad:
            time.sleep(poll_s)  # let the readers see the end of the output of ranks that just died
            # and count the ranks that ended meanwhile (a peer's failure ends the others soon)
            bad = [(r.rank, c) for r in ranks if (c := r.proc.poll()) not in (None, 0)]
            closed = {r.rank: r.output_closed_at for r in ranks}
            bad.sort(key=lambda b: (closed[b[0]] or math.inf, b[0]))
            rank, code = bad[0]
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            others = f" (also rank(s) {', '.join(str(b[0]) for b in bad[1:])})" if len(bad) > 1 else ""
            return "failed", f"rank {rank} exited with {how}{others}", code, rank
        if all(c == 0 for c in codes):
            return "ok", "", 0, None
        if time.monotonic() > deadline:
            live = [str(r.rank) for r, c in zip(ranks, codes) if c is None]
            return "timeout", (f"timed out after {timeout_s:.0f}s with rank(s) {', '.join(live)} "
                               "still running"), None, None
        time.sleep(poll_s)


def _dump_stacks(live: list[_Rank], arm_dir: Path, wait_s: float) -> str:
    for r in live:
        if r.proc.poll() is None:
            try:
                os.kill(r.proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait_s
    paths = {r.rank: stacks_path(arm_dir, r.rank) for r in live}

    def answered(r: _Rank) -> bool:
        path = paths[r.rank]
        return r.proc.poll() is not None or (path.is_file() and path.stat().st_size > 0)

    while time.monotonic() < deadline:
        if all(answered(r) for r in live):
            time.sleep(0.1)  # let the last frames land
            break
        time.sleep(0.05)
    parts = []
    for r in live:
        text = tail_text(paths[r.rank], STACK_LINES).strip()
        if not text:
            text = ("(no stack: the rank exited meanwhile)" if r.proc.poll() is not None
                    else "(no stack written: the rank did not answer SIGUSR1)")
        parts.append(f"[rank {r.rank}]\n{text}")
    return "\n".join(parts)


def _terminate(live: list[_Rank], grace_s: float) -> None:
    for r in live:
        _signal_group(r.proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for r in live:
        try:
            r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for r in live:
        if r.proc.poll() is None:
            _signal_group(r.proc, signal.SIGKILL)
            try:  # bounded: a Ctrl-C that landed inside Popen.poll between its lock's acquire
                # and its try (a CPython race) leaves that lock held, and an unbounded wait()
                # then blocks forever; the killed process is reaped when this one exits
                r.proc.wait(timeout=_REAP_AFTER_KILL_S)
            except subprocess.TimeoutExpired:
                pass


# --------------------------------------------------------------------------- the launcher
@dataclass(frozen=True)
class LocalLauncher:
    """Runs arms on this machine. ``timeout_min`` overrides ``case.resources.time_min``.
    ``warm``: fork the built-in workload's rank processes from warm servers that imported torch
    and the workload once (``harness.launch.warm``); False starts every one afresh. Use it as a
    context manager (or call :meth:`close`) so the servers end with the sweep."""

    timeout_min: Optional[float] = None
    python: str = sys.executable
    stack_wait_s: float = 3.0
    kill_grace_s: float = 5.0
    port_retries: int = 3
    warm: bool = True
    # Set by stop(): the arms running in other threads end their ranks (Ctrl-C reaches only one).
    stop_event: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    starter: Optional[WarmStarter] = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.warm and self.starter is None:
            object.__setattr__(self, "starter", WarmStarter(python=self.python))

    def __enter__(self) -> "LocalLauncher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the warm servers (a later arm starts new ones)."""
        if self.starter is not None:
            self.starter.close()
            object.__setattr__(self, "starter", WarmStarter(python=self.python))

    def stop(self) -> None:
        """End the ranks of every arm this launcher runs in another thread (the sweep was
        interrupted); each such ``run_arm`` raises KeyboardInterrupt once its ranks are ended."""
        self.stop_event.set()

    def timeout_s(self, plan: CasePlan) -> float:
        minutes = self.timeout_min if self.timeout_min is not None else plan.case.resources.time_min
        return 60.0 * minutes

    def run_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
                case_json: Path) -> ArmOutcome:
        """Run every rank of ``arm``; never raises for a failing arm (see :class:`ArmOutcome`)."""
        arm_dir = Path(arm_dir)
        gpus = cuda_device_count()
        arm_dir.mkdir(parents=True, exist_ok=True)
        skip = skip_reason(plan, gpus)
        if skip is not None:
            with open(arm_dir / LOG_FILE, "a", encoding="utf-8") as log:
                log.write(f"[launcher] case {plan.case_id} arm {arm.name}: skipped: {skip}\n")
            return ArmOutcome(status="skipped", detail=skip)
        repro = repro_line(plan, arm, case_json, self.python)
        if plan.case.command is not None:  # a training command instead of the built-in workload
            return run_command_arm(plan, arm, arm_dir, self.timeout_s(plan), gpus, repro,
                                   stack_wait_s=self.stack_wait_s, kill_grace_s=self.kill_grace_s)
        if arm.emulated:  # each emulated rank alone, on one GPU (side by side on several) or CPU
            return self._emulated(plan, gpus).run_arm(plan, arm, arm_dir, case_json)
        with open(arm_dir / LOG_FILE, "a", encoding="utf-8") as log:
            log.write(f"[launcher] case {plan.case_id} arm {arm.name}: "
                      f"{self._device(plan, arm, gpus)[1]}\n")
        outcomes: list[ArmOutcome] = []
        for stop in arm_legs(arm):  # an interrupted arm: stop after step K, then resume
            if stop is not None:
                with open(arm_dir / LOG_FILE, "a", encoding="utf-8") as log:
                    log.write(f"[launcher] case {plan.case_id} arm {arm.name}: stopping its ranks "
                              f"after step {stop} (compare.resume), then starting them again from "
                              "that checkpoint\n")
            left = self.timeout_s(plan) - sum(o.wall_s for o in outcomes)
            cmd = self._command(plan, arm, arm_dir, case_json, gpus, stop=stop,
                                timeout_s=max(left, 1.0), repro=repro)
            outcomes.append(run_ranks(cmd, stack_wait_s=self.stack_wait_s,
                                      kill_grace_s=self.kill_grace_s, port_retries=self.port_retries,
                                      starter=self.starter))
            if not outcomes[-1].ok:
                break
        return _joined(outcomes, arm_legs(arm))

    def prewarm(self, plans: Sequence[CasePlan], out_dir: Path,
                needs_run: Callable[[PlannedArm, Path], bool]) -> int:
        """Start, without waiting for them, the warm servers the arms of ``plans`` that
        ``needs_run(arm, arm_dir)`` will fork their ranks from (each imports torch and the
        workload: 5-12 s that the first arm of each rank environment would otherwise wait for).
        Nothing without a warm starter; the number of servers started."""
        if self.starter is None:
            return 0
        gpus = cuda_device_count()
        started = 0
        for plan in plans:
            if skip_reason(plan, gpus) is not None or plan.case.command is not None:
                continue
            case_dir = Path(out_dir) / plan.case_id
            for arm in plan.arms:
                if not needs_run(arm, case_dir / arm.name):
                    continue
                for cmd in self._first_commands(plan, arm, case_dir, gpus):
                    rank = cmd.started[0]
                    started += self.starter.prewarm(cmd.argv_of(rank),
                                                    cmd.env_of(os.environ, rank, 0))
        return started

    def _first_commands(self, plan: CasePlan, arm: PlannedArm, case_dir: Path,
                        gpus: int) -> list[RankCommand]:
        arm_dir, case_json = case_dir / arm.name, case_dir / CASE_FILE
        if arm.emulated:
            return self._emulated(plan, gpus).first_commands(plan, arm, arm_dir, case_json)
        return [self._command(plan, arm, arm_dir, case_json, gpus, stop=None,
                              timeout_s=self.timeout_s(plan), repro="")]

    def _emulated(self, plan: CasePlan, gpus: int) -> EmulatedLauncher:
        return EmulatedLauncher(gpus, self.timeout_s(plan), self.python,
                                run=functools.partial(run_ranks, starter=self.starter),
                                stack_wait_s=self.stack_wait_s, kill_grace_s=self.kill_grace_s)

    @staticmethod
    def _device(plan: CasePlan, arm: PlannedArm, gpus: int) -> tuple[dict[str, str], str]:
        extra, where = device_env(arm.world_size, gpus, plan.largest_arm.world_size)
        assert runs_on_cuda(plan, gpus) == (not extra)  # one rule for every arm of the case
        return extra, where

    def _command(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path, case_json: Path,
                 gpus: int, *, stop: Optional[int], timeout_s: float, repro: str) -> RankCommand:
        """The rank processes of one leg of built-in ``arm`` (``stop``: the step it stops after)."""
        argv = (self.python, "-u", "-m", "harness.launch.rank_main", "--case", str(case_json),
                "--arm", arm.name, "--out", str(arm_dir))
        return RankCommand(argv=argv + (("--stop-after", str(stop)) if stop is not None else ()),
                           world_size=arm.world_size, arm_dir=arm_dir, timeout_s=timeout_s,
                           env=self._device(plan, arm, gpus)[0], repro=repro,
                           stop=self.stop_event)


def _joined(outcomes: Sequence[ArmOutcome], legs: Sequence[Optional[int]]) -> ArmOutcome:
    """One outcome of an arm run in legs: the last leg's, with the legs' wall time and restarts
    summed; an interrupted arm's detail says where it was stopped (and which leg failed)."""
    last = outcomes[-1]
    if len(legs) == 1:
        return last
    stop = legs[0]
    where = (f"stopped by the harness after step {stop} and resumed from its checkpoint"
             if len(outcomes) == len(legs) else f"its first leg (to step {stop}) did not finish")
    detail = f"{where}; {last.detail}" if last.detail else where
    return dataclasses.replace(last, wall_s=round(sum(o.wall_s for o in outcomes), 3),
                               restarts=sum(o.restarts for o in outcomes), detail=detail)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.launch.local",
                                description="Run one arm of a case on this machine.")
    p.add_argument("--case", required=True, type=Path, metavar="CASE_JSON")
    p.add_argument("--arm", required=True, metavar="NAME")
    p.add_argument("--out", required=True, type=Path, metavar="ARM_DIR")
    p.add_argument("--timeout-min", type=float, default=None, metavar="M")
    args = p.parse_args(argv)
    try:
        plan = read_plan_beside(args.case)
        arm = plan.arm(args.arm)
        if args.timeout_min is not None and not args.timeout_min > 0:
            raise ConfigError(f"--timeout-min must be a positive number of minutes, got {args.timeout_min}")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with LocalLauncher(timeout_min=args.timeout_min) as launcher:
        outcome = launcher.run_arm(plan, arm, args.out, args.case)
    write_outcome(args.out, outcome)
    print(f"{plan.case_id} / {arm.name}: {outcome.describe()}  (log: {args.out / LOG_FILE})")
    if not outcome.ok:
        print(outcome.log_tail)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
