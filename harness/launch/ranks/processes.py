"""A process per rank: spawn the ranks of one arm on this machine, merge their output into the
arm's log, wait for them within a time limit, and tear them down.

Ranks rendezvous over TCP on 127.0.0.1 at a port picked by binding port 0 (retried on a fresh port
when a rank reports "address already in use"); a command given fixed rendezvous variables (Slurm,
a command case's launcher) never retries. Every line a rank prints goes to ``<arm_dir>/log.txt``
prefixed with ``[rank k]``. Emulated ranks run each alone (no rendezvous; ``emulated.py``).

A rank that exits non-zero fails the arm (``infra`` instead when ``failures.classify_exit`` sees an
infrastructure failure: killed by SIGKILL, an NCCL timeout, a peer's dropped connection in its
output; the same rule as under Slurm); an arm past its time limit times out. Either way the ranks
still alive get SIGUSR1 first (``rank_main`` dumps their Python stacks to ``stacks.rank<k>.txt``),
then their process groups are terminated (SIGTERM, then SIGKILL); stack files left empty are
removed. The outcome carries the log tail, those stacks, a one-line repro command and the cause the
failing rank's log names (``failures.rank_cause``: ``ExcType: message``). Nothing here raises for a
failing arm.
"""

from __future__ import annotations

import collections
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
from typing import IO, Deque, Mapping, Optional, Union

from harness.launch.ranks.failures import classify_exit, rank_cause, tail_text
from harness.launch.ranks.ports import is_addr_in_use, pick_free_port
from harness.launch.ranks.rank_main import LAUNCHER_PID_ENV, remove_empty_stacks, stacks_path
from harness.launch.ranks.warm import WarmProcess, WarmStarter
from harness.launch.ranks.variation import FIRST, Variation, describe
from harness.results import LOG_FILE, ArmOutcome, read_steps

# The repository, put on the ranks' PYTHONPATH so they import this harness.
REPO_ROOT = Path(__file__).resolve().parents[3]
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
    # What each process is in the log's ``[<label> k]`` prefixes: a rank, or (a command's
    # launcher, e.g. torchrun, one per node) a node.
    label: str = "rank"
    # Processes whose argument vector and rendezvous differ from ``argv`` / ``rendezvous`` (a
    # command case's launchers on one machine, one per node: each its own ``{node_rank}``).
    per_process: Mapping[int, "ProcessStart"] = field(default_factory=dict)
    # How the processes start in what the numbers must not depend on (``variation``): the
    # arm case's ``execution.vary_processes``.
    variation: Variation = FIRST

    @property
    def started(self) -> tuple[int, ...]:
        """The ranks this command starts."""
        return self.ranks or tuple(range(self.world_size))

    def argv_of(self, rank: int) -> list[str]:
        if rank in self.per_process:
            return list(self.per_process[rank].argv)
        return list(self.argv) + (["--emulate-rank", str(rank)] if self.emulated else [])

    def env_of(self, base: Mapping[str, str], rank: int, port: int) -> dict[str, str]:
        """Rank ``rank``'s whole environment, as its start (:attr:`variation`) gives it."""
        if not self.emulated:
            rendezvous = (self.per_process[rank].rendezvous if rank in self.per_process
                          else self.rendezvous)
            env = {**rank_env(base, rank, self.world_size, port, self.env), **rendezvous}
        else:
            extra = dict(self.env)
            if rank in self.devices:
                extra["CUDA_VISIBLE_DEVICES"] = self.devices[rank]
            env = alone_env(base, extra)
        return self.variation.environment(env, self.arm_dir)


@dataclass
class _Rank:
    """A running rank (mutable: its reader thread records when its output ended)."""

    rank: int
    proc: Union[subprocess.Popen, WarmProcess]
    tail: Deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    reader: Optional[threading.Thread] = None
    output_closed_at: Optional[float] = None  # ~ when it exited; orders simultaneous failures


# --------------------------------------------------------------------------- helpers
def rank_main_argv(python: str, case_json: Path, arm: str, arm_dir: Path) -> tuple[str, ...]:
    """A built-in rank process's argument vector. Its paths are absolute: a varied start
    (``variation``) runs the ranks in a working folder of their own."""
    return (python, "-u", "-m", "harness.launch.ranks.rank_main",
            "--case", str(Path(case_json).absolute()), "--arm", arm,
            "--out", str(Path(arm_dir).absolute()))


# The device files a GPU torch.cuda can use has on Linux: NVIDIA's (/dev/nvidiactl, /dev/nvidia0,
# ...), AMD ROCm's (/dev/kfd) and WSL's (/dev/dxg). With none of them there is no such GPU.
GPU_DEVICE_FILES = ("nvidia*", "kfd", "dxg")


def gpu_device_files(dev: Path = Path("/dev")) -> bool:
    """Whether ``dev`` holds a device file of :data:`GPU_DEVICE_FILES`."""
    return any(next(dev.glob(pattern), None) is not None for pattern in GPU_DEVICE_FILES)


def cuda_device_count() -> int:
    """CUDA GPUs visible to this process (0 without CUDA); does not create a CUDA context. On
    Linux without a GPU's device file (:func:`gpu_device_files`) it is 0 without importing torch
    (1-2 s a process that needs no torch before its first arm, e.g. to start a warm server)."""
    if sys.platform.startswith("linux") and not gpu_device_files():
        return 0
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


# What a built-in CPU rank's numbers need not depend on, pinned unless the launcher's own
# environment sets it (each is recorded: ``harness.environment.SETTINGS``, ``harness.kernels``),
# so that golden values repeat bit for bit on any host of the same kernels
# (docs/golden-values.md): one intra-op thread (how reductions and GEMMs split, else the host's
# core count) and MKL's COMPATIBLE code branch (conditional numerical reproducibility: fixed
# cache sizes, deterministic reductions, one code path on Intel and AMD alike; MKL's own
# dispatch picks other GEMM kernels per vendor and ISA, and its AVX2 and AVX-512 branches differ
# in the last bits here). ATen's vectorised kernels still follow the CPU (AVX2 / AVX-512: one
# golden file each, side by side). A command's processes keep the environment its case gives.
CPU_RANK_SETTINGS: Mapping[str, str] = {"OMP_NUM_THREADS": "1", "MKL_CBWR": "COMPATIBLE"}


def cpu_pinned(extra: Mapping[str, str], base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A built-in rank's ``extra`` environment (``device_env``'s) with :data:`CPU_RANK_SETTINGS`
    where it runs on the CPU (GPUs hidden) and ``base`` does not set them."""
    out = dict(extra)
    if out.get("CUDA_VISIBLE_DEVICES") == "":
        out = {**{k: v for k, v in CPU_RANK_SETTINGS.items() if k not in base}, **out}
    return out


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


def _pump(r: _Rank, log: IO[str], lock: threading.Lock, redact: tuple[str, ...],
          label: str = "rank") -> None:
    stream = r.proc.stdout
    assert stream is not None
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        for secret in redact:
            line = line.replace(secret, "***")
        r.tail.append(line)
        with lock:
            log.write(f"[{label} {r.rank}] {line}\n")
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
    ``starter``: fork them from its warm servers where it can (``harness.launch.ranks.warm``)."""
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
    v = cmd.variation
    argv, env = cmd.argv_of(rank), cmd.env_of(os.environ, rank, port)
    cwd = v.cwd(cmd.arm_dir, cmd.cwd)
    why = None
    if starter is not None and not v.cold_start:
        proc, why = starter.start(argv, env, str(cwd) if cwd is not None else None)
        if proc is not None:
            return proc, None
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, env=env,
                            cwd=cwd), why


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
              f"{shlex.join(cmd.argv)} {how} timeout {cmd.timeout_s:.0f}s; "
              f"{describe(cmd.variation)}\n")
    log.flush()
    ranks: list[_Rank] = []
    try:
        for k in cmd.variation.start_order(cmd.started):
            proc, cold_why = _spawn(cmd, k, port, starter)
            if cold_why is not None:
                with lock:
                    log.write(f"[launcher] rank {k} started cold: {cold_why}\n")
                    log.flush()
            r = _Rank(k, proc)
            r.reader = threading.Thread(target=_pump, args=(r, log, lock, cmd.redact, cmd.label),
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
        cause = rank_cause(arm_dir / LOG_FILE, culprit, cmd.label)
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
