"""The warm server: a process that imports what a rank imports once, then forks rank processes.

    python -u -m harness.launch.ranks.forkserver FD [--preload MODULE:FUNCTION]

Started by :class:`harness.launch.ranks.warm.WarmStarter` with the environment its ranks will have (all
but the rendezvous variables) and one end of a Unix ``SOCK_SEQPACKET`` socket pair as ``FD``. It
runs the preload (default ``harness.launch.ranks.rank_main:preload``: torch, dynamo, the workload), then
says whether it is safe to fork from: one thread only and no CUDA context (a fork after either
would give the children a broken runtime), Linux (``/proc/self/task``). Then it serves, one JSON
message per packet:

* ``{"start": ID, "argv": [...], "env": {...}, "cwd": PATH}`` with one file descriptor (the
  write end of the launcher's pipe for the rank's output) -> it forks a child and answers
  ``{"started": ID, "pid": PID}`` (or ``{"failed": ID, "why": TEXT}``);
* when a child exits it sends ``{"exited": PID, "code": CODE}`` (``subprocess`` style: ``-N``
  for signal N).

The child (:func:`_become`) leads a new session (as ``start_new_session`` would), takes the
pipe as stdout and stderr and ``/dev/null`` as stdin, changes to ``cwd``, replaces its
environment with ``env``, reseeds Python's ``random``, and runs ``python -m MODULE ARGS`` (the
argv's module, as ``__main__``), ending with ``os._exit``: it never returns into this loop.

When the launcher's end of the socket closes (the sweep ended, or the launcher died), the
server kills the process groups of the children still running and exits.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import random
import runpy
import select
import signal
import socket
import sys
import traceback
from typing import Any, Optional

MAX_MESSAGE = 1 << 20  # one request: argv and environment of one rank (a few KiB)
_REAP_EVERY_S = 0.02
DEFAULT_PRELOAD = "harness.launch.ranks.rank_main:preload"


def send(sock: socket.socket, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    """One JSON message (with ``fds`` passed along), one packet."""
    data = json.dumps(message).encode("utf-8")
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[Optional[dict[str, Any]], list[int]]:
    """The next message and the descriptors that came with it; (None, []) at end of stream."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, max_fds)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data.decode("utf-8")), list(fds)


def fork_problem() -> Optional[str]:
    """Why forking this process now could break its children (None: safe).

    A thread that a fork leaves behind in the parent is one the children lack but may rely on
    (an OpenMP pool, a Python thread). Threads whose owner shuts them down at every fork are
    fine: OpenBLAS (numpy's BLAS, started by its import) does, through ``pthread_atfork``. So
    the count is taken after one probe fork, whose child exits at once. The count also sees a
    call into CUDA: ``import torch`` maps libcuda but calls nothing (a child forked then uses
    CUDA), while ``torch.cuda.device_count()`` or ``is_available()`` leaves a driver thread
    behind (measured on an H100, torch 2.11: one more thread, and after ``is_available()`` the
    child's CUDA refuses to start)."""
    import threading

    try:
        os.listdir("/proc/self/task")
    except OSError:
        return "not Linux (/proc/self/task unreadable): cannot check that the server has one thread"
    probe = os.fork()
    if probe == 0:
        os._exit(0)
    os.waitpid(probe, 0)
    tasks = len(os.listdir("/proc/self/task"))
    if tasks != 1 or threading.active_count() != 1:
        return (f"the preload left {tasks} OS thread(s) ({threading.active_count()} Python "
                "thread(s)) running across a fork; a fork copies only one")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the preload created a CUDA context, which a forked child cannot use"
    return None


def _preload(spec: str) -> None:
    module, _, function = spec.partition(":")
    target = importlib.import_module(module)
    if function:
        getattr(target, function)()


def _become(request: dict[str, Any], out_fd: int, sock: socket.socket) -> None:
    """In the forked child: become the rank process the request describes (never returns)."""
    code = 1
    try:
        os.setsid()
        sock.close()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(devnull)
        os.close(out_fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        random.seed()  # as a fresh interpreter would be
        argv = list(request["argv"])
        module = argv[argv.index("-m") + 1]
        sys.argv = [module] + argv[argv.index("-m") + 2:]
        # As under ``python -m``: the module runs as ``__main__`` only, not also under its name
        # (the preload imported it), so an import of it by name makes a second copy, as cold.
        sys.modules.pop(module, None)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the rank's traceback, as a cold process prints it
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _start(request: dict[str, Any], fds: list[int], sock: socket.socket,
           children: set[int]) -> None:
    ident = request.get("start")
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        send(sock, {"failed": ident, "why": f"expected one output descriptor, got {len(fds)}"})
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(fds[0])
        send(sock, {"failed": ident, "why": f"fork failed: {exc}"})
        return
    if pid == 0:
        _become(request, fds[0], sock)
    os.close(fds[0])
    children.add(pid)
    send(sock, {"started": ident, "pid": pid})


def _reap(sock: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        send(sock, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _kill_all(children: set[int]) -> None:
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in list(children):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def serve(sock: socket.socket) -> None:
    """Fork a child per request until the launcher's end closes (see the module doc)."""
    children: set[int] = set()
    try:
        while True:
            ready, _, _ = select.select([sock], [], [], _REAP_EVERY_S)
            _reap(sock, children)
            if not ready:
                continue
            request, fds = receive(sock, max_fds=1)
            if request is None:
                return
            _start(request, fds, sock, children)
    except (BrokenPipeError, ConnectionResetError):
        return
    finally:
        _kill_all(children)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.launch.ranks.forkserver")
    p.add_argument("fd", type=int, help="this end of the launcher's socket pair")
    p.add_argument("--preload", default=DEFAULT_PRELOAD, metavar="MODULE:FUNCTION")
    args = p.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    try:
        _preload(args.preload)
        problem = fork_problem()
    except BaseException as exc:  # noqa: BLE001 - said to the launcher, which starts ranks cold
        problem = f"the preload {args.preload} failed: {type(exc).__name__}: {exc}"
    if problem is not None:
        try:
            send(sock, {"refused": problem})
        except OSError:  # the launcher is gone
            pass
        return 0
    gc.collect()
    gc.freeze()  # the imported modules' objects stay out of the children's collections
    try:
        send(sock, {"ready": os.getpid()})
    except OSError:  # the launcher is gone (it closed while this imported): nothing to serve
        return 0
    serve(sock)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: it unloads torch's modules for nothing (~1-2 s)
