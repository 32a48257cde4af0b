"""SIGTERM to `dcp-harness run` (``timeout``, Slurm cancellation) takes Ctrl-C's path: the ranks,
started in their own sessions, are stopped, and the harness says ``interrupted`` and exits 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
EXIT_INTERRUPTED = 130  # harness.cli.main on KeyboardInterrupt


def _rank_files(sweep: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(sweep.rglob("rank*.jsonl"))}


def _open_files(entry: Path) -> str:
    """The paths a process holds open (a rank forked by a warm server has the server's command
    line, but holds its arm's stack file open: ``rank_main.register_stack_dump``)."""
    names = []
    try:
        for fd in (entry / "fd").iterdir():
            try:
                names.append(os.readlink(fd))
            except OSError:
                pass
    except OSError:
        pass
    return " ".join(names)


def _processes_naming(text: str) -> list[str]:
    """cmdlines of live processes (not zombies) whose arguments or open files mention ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (text in cmdline or text in _open_files(entry)):
            found.append(f"{entry.name}: {cmdline} (open: {_open_files(entry)})")
    return found


def test_sigterm_stops_the_ranks_like_ctrl_c(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", "cases/focused", "-k", "tiny-moe-eager",
         "--out", str(sweep)],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # Until the first arm's rank runs (its own session). Its first record can take 20 s on a
        # loaded 2-core machine; a rank still importing torch is orphaned all the same.
        deadline = time.monotonic() + 60
        while not [c for c in _processes_naming(str(sweep)) if "stacks.rank" in c]:
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
            assert time.monotonic() < deadline, "the first arm's rank did not start within 60 s"
            time.sleep(0.1)
        time.sleep(1)

        proc.send_signal(signal.SIGTERM)  # the harness only, not the ranks' own sessions
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.decode(errors="replace")
    try:
        _check_stopped(proc.returncode, text, sweep)
    finally:  # never leave an orphan of this test's sweep behind (it would run for minutes)
        for line in _processes_naming(str(sweep)):
            try:
                os.killpg(int(line.split(":")[0]), signal.SIGKILL)
            except OSError:
                pass


def _check_stopped(returncode: int, text: str, sweep: Path) -> None:
    assert returncode == EXIT_INTERRUPTED, text
    assert text.splitlines()[-1] == "interrupted", text
    before = _rank_files(sweep)
    time.sleep(3)
    assert _rank_files(sweep) == before, "a rank kept writing records after the harness exited"
    assert _processes_naming(str(sweep)) == [], "rank processes outlived the harness"
