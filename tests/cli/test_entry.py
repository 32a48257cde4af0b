"""`harness.cli.entry`: the process entry point ends without the interpreter's teardown, after
the exit handlers, with the command's code and its output flushed; a thread still running is
waited for the ordinary way."""

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "entry_script.py"
    script.write_text(textwrap.dedent(f"""
        import atexit, sys, threading, time
        import harness.cli as cli
        marks = {str(tmp_path / "marks.txt")!r}
        atexit.register(lambda: open(marks, "a").write("atexit\\n"))
        {body}
        cli.entry()
        """))
    return subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_entry_runs_exit_handlers_flushes_and_keeps_the_code(tmp_path):
    proc = _run(tmp_path, textwrap.dedent("""
        def fake_main():
            sys.stdout.write("no newline, still buffered")
            return 3
        cli.main = fake_main
        """).replace("\n", "\n        "))
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "no newline, still buffered"
    assert (tmp_path / "marks.txt").read_text() == "atexit\n"


def test_entry_waits_for_a_thread_still_running(tmp_path):
    proc = _run(tmp_path, textwrap.dedent("""
        def late():
            time.sleep(0.5)
            open(marks, "a").write("thread\\n")
        def fake_main():
            threading.Thread(target=late).start()
            return 0
        cli.main = fake_main
        """).replace("\n", "\n        "))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "marks.txt").read_text() == "thread\natexit\n"
