"""Warm rank processes: what every rank imports is imported once per sweep, and ranks are forked.

A rank process spends most of its start importing (torch with its CUDA libraries, dynamo, the
workload: 10-12 s on a GPU host against ~8 s of steps for a one-GPU graph arm, 0.8-2 s on a CPU;
``bench/arm_phases.py``), the same work for every rank of every arm. :class:`WarmStarter` keeps one
server process (``harness.launch.ranks.forkserver``) per rank environment, started ahead
(:meth:`WarmStarter.prewarm`: the sweep starts every one its arms need before the first) or on
first use: it imports ``rank_main.preload``'s modules, then forks each rank process on request.
A forked rank is the same program as a cold ``python -u -m harness.launch.ranks.rank_main ...``: its
own session, its output on the launcher's pipe, its own environment, ``rank_main`` run as
``__main__``.

Why no judged figure changes (checked by ``tests/launch/ranks/test_warm.py`` on CPU and on a GPU by
``bench/warm_vs_cold.py``: every step record equal but its timings):

* a server is keyed by the rank's whole environment but the variables no import reads
  (:data:`NOT_READ_AT_IMPORT`: the rendezvous); so what the imports read (``OMP_*``,
  ``CUDA_VISIBLE_DEVICES``, ``PYTHONPATH``, a test's start-up hooks) is what a cold rank reads;
* the server refuses to serve (and ranks start cold, said in the arm's log) when its imports
  left a thread that survives a fork (a CUDA driver call leaves one), created a CUDA context, or
  off Linux: a fork copies one thread only, and CUDA state cannot cross a fork;
* no CUDA, NCCL, OpenMP or memory state exists before the fork: each rank creates its own.

The rank's parent is the server, so its orphan watchdog (``rank_main``) watches the server;
the server exits, killing the process groups of ranks still running, when the launcher's end of
its socket closes (:meth:`WarmStarter.close`, or the launcher's death). A server that dies ends
its ranks' :class:`WarmProcess` with ``-SIGKILL`` (an infrastructure failure).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import IO, Mapping, Optional, Sequence

from harness.launch.ranks.forkserver import DEFAULT_PRELOAD, receive, send
from harness.launch.ranks.rank_main import LAUNCHER_PID_ENV

# The rank entry points a warm server runs (anything else starts cold).
WARM_MODULES = ("harness.launch.ranks.rank_main",)
# Variables no import reads, left out of a server's key: set per rank, read when the rank joins
# its process group. (CUDA_VISIBLE_DEVICES stays in the key: CUDA reads it when it starts, after
# the fork, but whether the driver library, mapped by ``import torch``, reads it when loaded is
# not something measured here; a second server costs one import.)
NOT_READ_AT_IMPORT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT", LAUNCHER_PID_ENV)
_READY_TIMEOUT_S = 300.0  # the server's imports (10-12 s on a GPU host; more on a loaded one)


class WarmProcess:
    """A rank process forked by a warm server: ``pid``, ``stdout`` (its output, read end),
    ``poll()``, ``wait(timeout)`` and ``returncode`` as ``subprocess.Popen`` has them."""

    def __init__(self, pid: int, stdout: IO[bytes], args: Sequence[str]) -> None:
        self.pid = pid
        self.stdout = stdout
        self.args = list(args)
        self.returncode: Optional[int] = None
        self._done = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class _Server:
    """One warm server process and the launcher's end of its socket. Made, the server is
    started and importing; :meth:`handshake` waits for it to say whether it serves."""

    def __init__(self, python: str, env: Mapping[str, str], preload: str) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [python, "-u", "-m", "harness.launch.ranks.forkserver", str(theirs.fileno()),
                 "--preload", preload],
                env=dict(env), pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self.sock = mine
        self.problem: Optional[str] = None
        self.pid = 0
        self._shaken = False  # handshake() done (and never again)
        self._serving = False  # it said it is ready: only then can it have ranks
        self._lock = threading.Lock()  # one request at a time: its answer comes before the next
        self._answers: dict[int, dict] = {}
        self._answered = threading.Condition()
        self._procs: dict[int, WarmProcess] = {}  # running ranks by pid
        self._early: dict[int, int] = {}  # exit codes of ranks not registered yet
        self._next = 0
        self._closed = False

    def handshake(self) -> None:
        """Wait until the server has imported and said whether it serves (``problem`` says why
        not). Called by one thread at a time (the slot's lock); once."""
        if self._shaken:
            return
        self._shaken = True
        self.sock.settimeout(_READY_TIMEOUT_S)
        try:
            hello, _ = receive(self.sock)
        except (socket.timeout, OSError) as exc:
            hello = {"refused": f"no answer from the warm server: {exc}"}
        if hello is None or "ready" not in hello:
            self.problem = (hello or {}).get("refused") or "the warm server exited while importing"
            self.close()
            return
        self.sock.settimeout(None)
        self.pid = int(hello["ready"])
        self._serving = True
        threading.Thread(target=self._read, name="warm-server", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                message, _ = receive(self.sock)
            except OSError:
                message = None
            if message is None:
                break
            if "exited" in message:
                self._exited(int(message["exited"]), int(message["code"]))
            else:
                with self._answered:
                    self._answers[int(message.get("started", message.get("failed", -1)))] = message
                    self._answered.notify_all()
        with self._answered:  # the server is gone: so are its ranks (their watchdog kills them)
            self._closed = True
            self._answered.notify_all()
            left, self._procs = list(self._procs.values()), {}
        for proc in left:
            proc._exited(-signal.SIGKILL)

    def _exited(self, pid: int, code: int) -> None:
        with self._answered:
            proc = self._procs.pop(pid, None)
            if proc is None:  # its exit overtook the caller registering it: kept for start()
                self._early[pid] = code
                return
        proc._exited(code)

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> WarmProcess:
        """Fork a rank process; OSError when the server cannot."""
        read_fd, write_fd = os.pipe()
        try:
            with self._lock:
                ident = self._next
                self._next += 1
                env = {**env, LAUNCHER_PID_ENV: str(self.pid)}  # its parent: the server
                send(self.sock, {"start": ident, "argv": list(argv), "env": env, "cwd": cwd},
                     (write_fd,))
                answer = self._answer(ident)
                if "pid" not in answer:
                    raise OSError(f"the warm server could not start the rank: {answer.get('why')}")
                proc = WarmProcess(int(answer["pid"]), os.fdopen(read_fd, "rb"), argv)
                read_fd = -1
                with self._answered:
                    early = self._early.pop(proc.pid, None)
                    if early is None:
                        self._procs[proc.pid] = proc
                if early is not None:
                    proc._exited(early)
                return proc
        finally:
            os.close(write_fd)
            if read_fd >= 0:
                os.close(read_fd)

    def _answer(self, ident: int) -> dict:
        with self._answered:
            while ident not in self._answers:
                if self._closed:
                    raise OSError("the warm server exited")
                self._answered.wait(1.0)
            return self._answers.pop(ident)

    def hang_up(self) -> None:
        """Close the launcher's end: the server ends its ranks and exits. ``shutdown`` first:
        a plain ``close`` while the reader thread waits in ``recvmsg`` on this socket keeps the
        socket open in the kernel until that call returns, so the server would never see the
        end of stream (and ``close`` would kill it after its timeout)."""
        for end in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                end()
            except OSError:
                pass

    def close(self) -> None:
        self.hang_up()
        if not self._serving:  # importing, or refused: it has no ranks to end, nothing to wait for
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class WarmStarter:
    """Starts rank processes from warm servers, one per rank environment (see the module doc).
    ``start`` returns None for what it does not start (another program, or no safe server:
    ``refused`` says why); the caller then starts the process cold."""

    python: str = sys.executable
    preload: str = DEFAULT_PRELOAD
    modules: tuple[str, ...] = WARM_MODULES
    _slots: dict[tuple, "_Slot"] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _closed: bool = False

    def __post_init__(self) -> None:
        # A starter nobody closed (dropped with its launcher) still ends its servers.
        weakref.finalize(self, _close_slots, self._slots)

    def key(self, env: Mapping[str, str]) -> tuple:
        return tuple(sorted((k, v) for k, v in env.items() if k not in NOT_READ_AT_IMPORT))

    def runs(self, argv: Sequence[str]) -> bool:
        """Whether ``argv`` is a program a warm server runs: ``python [-u] -m MODULE ...``."""
        args = list(argv)
        if not args or args[0] != self.python:
            return False
        flags = args[1:args.index("-m")] if "-m" in args else None
        return (flags is not None and set(flags) <= {"-u"}
                and args[args.index("-m") + 1] in self.modules)

    def server(self, env: Mapping[str, str]) -> _Server:
        """The server for ``env`` (started now, importing, if there is none yet: the first rank
        of an environment waits for its imports, ranks of other environments do not)."""
        key = self.key(env)
        with self._lock:
            if self._closed:
                raise OSError("the warm starter is closed")
            slot = self._slots.setdefault(key, _Slot())
        with slot.lock:
            if slot.server is None:
                slot.server = _Server(self.python, dict(key), self.preload)
            slot.server.handshake()
            return slot.server

    def prewarm(self, argv: Sequence[str], env: Mapping[str, str]) -> int:
        """Start the server ``argv`` with ``env`` will be forked from, if there is none yet,
        without waiting for its imports (they run beside whatever runs now; the first rank of
        the environment then finds it ready or nearly). 1 when a server was started, else 0."""
        if not self.runs(argv):
            return 0
        key = self.key(env)
        with self._lock:
            if self._closed:
                return 0
            slot = self._slots.setdefault(key, _Slot())
        with slot.lock:
            if slot.server is not None:
                return 0
            try:
                slot.server = _Server(self.python, dict(key), self.preload)
            except OSError:  # the arm tries again when it starts, and says why it starts cold
                return 0
            return 1

    def start(self, argv: Sequence[str], env: Mapping[str, str],
              cwd: Optional[str] = None) -> tuple[Optional[WarmProcess], Optional[str]]:
        """(the forked rank, None), or (None, why it starts cold; None when it is not a rank)."""
        if not self.runs(argv):
            return None, None
        try:
            server = self.server(env)
            if server.problem is not None:
                return None, f"warm start refused: {server.problem}"
            return server.start(argv, env, cwd or os.getcwd()), None
        except OSError as exc:
            return None, f"warm start failed: {exc}"

    def close(self) -> None:
        """End every server (and the ranks still running under one)."""
        with self._lock:
            self._closed = True
        _close_slots(self._slots)


def _close_slots(slots: dict[tuple, "_Slot"]) -> None:
    taken = list(slots.values())
    slots.clear()
    servers = []
    for slot in taken:
        with slot.lock:
            if slot.server is not None:
                servers.append(slot.server)
                slot.server = None
    for server in servers:  # every server told first, then waited for: they end side by side
        server.hang_up()
    for server in servers:
        server.close()


@dataclass
class _Slot:
    """Where the server of one environment is (None until its first rank starts it)."""

    server: Optional[_Server] = None
    lock: threading.Lock = field(default_factory=threading.Lock)
