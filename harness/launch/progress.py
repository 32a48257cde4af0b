"""Progress of a sweep for people: cases done/total and the running arm's step.

``make_progress()`` picks a live rich display on a terminal and plain lines otherwise (CI logs).
The running arm's step comes from tailing its rank-0 JSONL file (:class:`StepTail`), so it works
for any launcher that writes through the results store.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Optional, Protocol

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from harness.compare import CaseVerdict
from harness.results import LOG_FILE, ArmOutcome, StepRecord, parse_step_line, rank_file

_POLL_S = 0.25


class SweepProgress(Protocol):
    def sweep_started(self, total_cases: int) -> None: ...
    def case_started(self, case_id: str, index: int, arms: int) -> None: ...
    def arm_started(self, case_id: str, arm: str, arm_dir: Path, steps: int) -> None: ...
    def arm_skipped(self, case_id: str, arm: str, reason: str) -> None: ...
    def arm_finished(self, case_id: str, arm: str, outcome: ArmOutcome) -> None: ...
    def case_finished(self, case_id: str, verdict: CaseVerdict) -> None: ...
    def close(self) -> None: ...


class StepTail:
    """Reads the complete lines appended to a JSONL file since the last poll."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    def poll(self) -> Optional[StepRecord]:
        """The newest complete record appended since the last call, or None (lines that are not
        step records are passed over: a live display never stops a run)."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return None
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" after a complete line
        for raw in reversed(lines):
            rec = parse_step_line(raw)
            if rec is not None:
                return rec
        return None


class StepFollower:
    """A daemon thread that polls a :class:`StepTail` and calls ``on_record`` with each newest
    record, until :meth:`stop`."""

    def __init__(self, path: Path, on_record: Callable[[StepRecord], None],
                 poll_s: float = _POLL_S) -> None:
        self._tail = StepTail(path)
        self._on_record = on_record
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="step-follower", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            rec = self._tail.poll()
            if rec is not None:
                self._on_record(rec)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _loss_text(rec: StepRecord) -> str:
    return f" loss {rec.loss:.4f}" if rec.loss is not None else ""


class NullProgress:
    """Shows nothing."""

    def sweep_started(self, total_cases: int) -> None: pass
    def case_started(self, case_id: str, index: int, arms: int) -> None: pass
    def arm_started(self, case_id: str, arm: str, arm_dir: Path, steps: int) -> None: pass
    def arm_skipped(self, case_id: str, arm: str, reason: str) -> None: pass
    def arm_finished(self, case_id: str, arm: str, outcome: ArmOutcome) -> None: pass
    def case_finished(self, case_id: str, verdict: CaseVerdict) -> None: pass
    def close(self) -> None: pass


class LineProgress:
    """One plain line per event (for logs and non-terminals), plus the running arm's step at
    most every ``step_every_s`` seconds."""

    def __init__(self, stream: IO[str], step_every_s: float = 30.0) -> None:
        self._out = stream
        self._total = 0
        self._index = 0
        self._step_every_s = step_every_s
        self._follower: Optional[StepFollower] = None
        self._lock = threading.Lock()

    def _say(self, text: str) -> None:
        with self._lock:
            print(text, file=self._out, flush=True)

    def _where(self) -> str:
        return f"[{self._index + 1}/{self._total}]"

    def sweep_started(self, total_cases: int) -> None:
        self._total = total_cases

    def case_started(self, case_id: str, index: int, arms: int) -> None:
        self._index = index
        self._say(f"{self._where()} {case_id}: {arms} arm(s)")

    def arm_started(self, case_id: str, arm: str, arm_dir: Path, steps: int) -> None:
        self._say(f"{self._where()} {case_id} / {arm}: running {steps} step(s) "
                  f"(log: {arm_dir / LOG_FILE})")
        last_said = [time.monotonic()]

        def on_record(rec: StepRecord) -> None:
            now = time.monotonic()
            if now - last_said[0] >= self._step_every_s:
                last_said[0] = now
                self._say(f"{self._where()} {case_id} / {arm}: step {rec.step}/{steps}"
                          f"{_loss_text(rec)}")

        self._follower = StepFollower(rank_file(arm_dir, 0), on_record)

    def _stop_following(self) -> None:
        if self._follower is not None:
            self._follower.stop()
            self._follower = None

    def arm_skipped(self, case_id: str, arm: str, reason: str) -> None:
        self._say(f"{self._where()} {case_id} / {arm}: skipped ({reason})")

    def arm_finished(self, case_id: str, arm: str, outcome: ArmOutcome) -> None:
        self._stop_following()
        self._say(f"{self._where()} {case_id} / {arm}: {outcome.describe()}")

    def case_finished(self, case_id: str, verdict: CaseVerdict) -> None:
        self._say(f"{self._where()} {case_id}: {verdict.status}")

    def close(self) -> None:
        self._stop_following()


class RichProgress:
    """A live display: a bar of cases done/total and one of the running arm's steps."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=console, transient=True,
        )
        self._cases = self._progress.add_task("cases", total=0)
        self._arm: Optional[TaskID] = None
        self._follower: Optional[StepFollower] = None
        self._progress.start()

    def _print(self, markup: str) -> None:
        self._progress.console.print(markup, highlight=False)

    def sweep_started(self, total_cases: int) -> None:
        self._progress.update(self._cases, total=total_cases)

    def case_started(self, case_id: str, index: int, arms: int) -> None:
        self._progress.update(self._cases, description=f"cases (now {escape(case_id)})")

    def arm_started(self, case_id: str, arm: str, arm_dir: Path, steps: int) -> None:
        label = f"  {escape(case_id)} / {escape(arm)}"
        task = self._progress.add_task(label, total=steps)
        self._arm = task

        def on_record(rec: StepRecord) -> None:
            self._progress.update(task, completed=rec.step, description=label + _loss_text(rec))

        self._follower = StepFollower(rank_file(arm_dir, 0), on_record)

    def _stop_following(self) -> None:
        if self._follower is not None:
            self._follower.stop()
            self._follower = None
        if self._arm is not None:
            self._progress.remove_task(self._arm)
            self._arm = None
            self._progress.refresh()

    def arm_skipped(self, case_id: str, arm: str, reason: str) -> None:
        self._print(escape(f"{case_id} / {arm}: skipped ({reason})"))

    def arm_finished(self, case_id: str, arm: str, outcome: ArmOutcome) -> None:
        self._stop_following()
        style = "green" if outcome.ok else "red"
        self._print(f"{escape(case_id)} / {escape(arm)}: [{style}]{escape(outcome.describe())}[/{style}]")

    def case_finished(self, case_id: str, verdict: CaseVerdict) -> None:
        self._progress.advance(self._cases)
        style = {"pass": "green", "fail": "red"}.get(verdict.status, "yellow")
        self._print(f"{escape(case_id)}: [{style}]{verdict.status}[/{style}]")

    def close(self) -> None:
        self._stop_following()
        self._progress.stop()


def make_progress(stream: IO[str] = sys.stderr) -> SweepProgress:
    """Rich live progress on a terminal, plain lines otherwise."""
    if stream.isatty():
        return RichProgress(Console(file=stream))
    return LineProgress(stream)
