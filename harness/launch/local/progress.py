"""Progress of a sweep for people: cases done/total, the running arm's step, the time left.

``make_progress()`` picks a live rich display on a terminal and plain lines otherwise (CI logs).
The running arm's step comes from tailing its rank-0 JSONL file (:class:`StepTail`), so it works
for any launcher that writes through the results store. Given the sweep's plans, a
:class:`SuiteClock` estimates the time left (``~N s left``: ``harness.launch.local.estimate``, from an
earlier sweep's figures and the arms this one has finished) and knows the cases this machine
skips, whose arms are then not announced as running.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Optional, Protocol, Sequence

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

from harness.caseplan import CasePlan
from harness.compare import CaseVerdict
from harness.launch.local.estimate import (
    Estimate,
    MeasuredArm,
    Total,
    add_estimates,
    estimate_arm,
    measure_arm,
    measure_sweep,
)
from harness.launch.ranks.placement import skip_reason
from harness.launch.ranks.processes import cuda_device_count
from harness.results import (LOG_FILE, ArmOutcome, ResultsError, StepRecord, parse_step_line,
                             rank_file)

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


class SuiteClock:
    """The time a sweep has left: every planned arm's estimate (``harness.launch.local.estimate``) on a
    machine with ``gpus`` CUDA GPUs, learning from ``history`` (an earlier sweep's arms) and from
    each arm this sweep finishes; the running arm counts what is left of its estimate."""

    def __init__(self, plans: Sequence[CasePlan], gpus: int,
                 history: Sequence[MeasuredArm] = ()) -> None:
        self._plans = list(plans)
        self._gpus = gpus
        self._history = list(history)
        self._finished: list[MeasuredArm] = []
        self._done: set[tuple[int, str]] = set()
        self._running: dict[tuple[int, str], float] = {}  # arm -> when it started (two lanes: two)
        self._estimates = self._estimate_all()

    def _estimate_all(self) -> dict[tuple[int, str], Estimate]:
        measured = self._finished + self._history  # this sweep's first: this machine, today
        return {(i, arm.name): estimate_arm(plan, arm, self._gpus, measured)
                for i, plan in enumerate(self._plans) for arm in plan.arms}

    def skipped(self, index: int) -> Optional[str]:
        """Why this machine skips case ``index`` (None: it runs)."""
        return skip_reason(self._plans[index], self._gpus)

    def estimate(self, index: int, arm: str) -> Estimate:
        return self._estimates[(index, arm)]

    def arm_started(self, index: int, arm: str) -> None:
        self._running[(index, arm)] = time.monotonic()

    def arm_ended(self, index: int, arm: str, arm_dir: Optional[Path] = None) -> None:
        """Arm ``arm`` of case ``index`` is over (ran, skipped or already complete); its
        figures (``arm_dir``) teach the estimates of the arms still to come."""
        self._done.add((index, arm))
        self._running.pop((index, arm), None)
        plan = self._plans[index]
        if arm_dir is not None:
            try:
                found = measure_arm(plan, next(a for a in plan.arms if a.name == arm), arm_dir)
            except (ResultsError, OSError, StopIteration):
                found = None  # no figures: the estimates stay as they were
            if found is not None:
                self._finished.insert(0, found)
                self._estimates = self._estimate_all()

    def left(self) -> Total:
        """The time left: the arms not over, the running one less the time it has run."""
        items = []
        for key, est in self._estimates.items():
            if key in self._done:
                continue
            if key in self._running and est.seconds is not None:
                est = Estimate(max(0.0, est.seconds - (time.monotonic() - self._running[key])),
                               est.basis)
            items.append(est)
        return add_estimates(items)

    def left_text(self) -> str:
        """``~95 s left``, ``at least ~40 s left (...)``, or "" while nothing is known."""
        head, _, tail = self.left().text().partition(" (")
        return f"{head} left" + (f" ({tail}" if tail else "") if head else ""


class NullProgress:
    """Shows nothing."""

    def sweep_started(self, total_cases: int) -> None: pass
    def case_started(self, case_id: str, index: int, arms: int) -> None: pass
    def arm_started(self, case_id: str, arm: str, arm_dir: Path, steps: int) -> None: pass
    def arm_skipped(self, case_id: str, arm: str, reason: str) -> None: pass
    def arm_finished(self, case_id: str, arm: str, outcome: ArmOutcome) -> None: pass
    def case_finished(self, case_id: str, verdict: CaseVerdict) -> None: pass
    def close(self) -> None: pass


def _estimate_text(est: Estimate) -> str:
    return f", ~{est.seconds:.0f} s" if est.seconds is not None and est.basis != "skipped" else ""


class LineProgress:
    """One plain line per event (for logs and non-terminals), plus the running arm's step at
    most every ``step_every_s`` seconds; with a ``clock``, the arm's estimate and the time left."""

    def __init__(self, stream: IO[str], step_every_s: float = 30.0,
                 clock: Optional[SuiteClock] = None) -> None:
        self._out = stream
        self._total = 0
        self._index: dict[str, int] = {}  # case -> its index (cases of two lanes interleave)
        self._step_every_s = step_every_s
        self._followers: dict[tuple[str, str], StepFollower] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._arm_dirs: dict[tuple[str, str], Path] = {}

    def _left(self) -> str:
        left = self._clock.left_text() if self._clock is not None else ""
        return f"; {left}" if left else ""

    def _say(self, text: str) -> None:
        with self._lock:
            print(text, file=self._out, flush=True)

    def _where(self, case_id: str) -> str:
        return f"[{self._index.get(case_id, 0) + 1}/{self._total}]"

    def sweep_started(self, total_cases: int) -> None:
        self._total = total_cases

    def case_started(self, case_id: str, index: int, arms: int) -> None:
        self._index[case_id] = index
        self._say(f"{self._where(case_id)} {case_id}: {arms} arm(s)")

    def arm_started(self, case_id: str, arm: str, arm_dir: Path, steps: int) -> None:
        self._arm_dirs[(case_id, arm)] = arm_dir
        clock, index = self._clock, self._index.get(case_id, 0)
        estimate = ""
        if clock is not None:
            clock.arm_started(index, arm)
            if clock.skipped(index) is not None:
                return  # the launcher skips it at once: its outcome line says so
            estimate = _estimate_text(clock.estimate(index, arm))
        self._say(f"{self._where(case_id)} {case_id} / {arm}: running {steps} step(s){estimate} "
                  f"(log: {arm_dir / LOG_FILE})")
        last_said = [time.monotonic()]

        def on_record(rec: StepRecord) -> None:
            now = time.monotonic()
            if now - last_said[0] >= self._step_every_s:
                last_said[0] = now
                self._say(f"{self._where(case_id)} {case_id} / {arm}: step {rec.step}/{steps}"
                          f"{_loss_text(rec)}{self._left()}")

        self._followers[(case_id, arm)] = StepFollower(rank_file(arm_dir, 0), on_record)

    def _stop_following(self, key: Optional[tuple[str, str]] = None) -> None:
        for k in [key] if key is not None else list(self._followers):
            follower = self._followers.pop(k, None)
            if follower is not None:
                follower.stop()

    def arm_skipped(self, case_id: str, arm: str, reason: str) -> None:
        if self._clock is not None:
            self._clock.arm_ended(self._index.get(case_id, 0), arm)
        self._say(f"{self._where(case_id)} {case_id} / {arm}: skipped ({reason})")

    def arm_finished(self, case_id: str, arm: str, outcome: ArmOutcome) -> None:
        self._stop_following((case_id, arm))
        if self._clock is not None:
            self._clock.arm_ended(self._index.get(case_id, 0), arm,
                                  self._arm_dirs.get((case_id, arm)))
        self._say(f"{self._where(case_id)} {case_id} / {arm}: {outcome.describe()}{self._left()}")

    def case_finished(self, case_id: str, verdict: CaseVerdict) -> None:
        self._say(f"{self._where(case_id)} {case_id}: {verdict.status}")

    def close(self) -> None:
        self._stop_following()


class RichProgress:
    """A live display: a bar of cases done/total (with a ``clock``: and the time left) and one of
    the running arm's steps."""

    def __init__(self, console: Console, clock: Optional[SuiteClock] = None) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=console, transient=True,
        )
        self._cases = self._progress.add_task("cases", total=0)
        self._arms: dict[tuple[str, str], TaskID] = {}  # (case, arm) -> its bar (two lanes: two)
        self._followers: dict[tuple[str, str], StepFollower] = {}
        self._clock = clock
        self._index: dict[str, int] = {}
        self._case = ""
        self._arm_dirs: dict[tuple[str, str], Path] = {}
        self._progress.start()

    def _show_left(self) -> None:
        left = self._clock.left_text() if self._clock is not None else ""
        left = f", {escape(left)}" if left else ""
        self._progress.update(self._cases, description=f"cases (now {escape(self._case)}{left})")

    def _print(self, markup: str) -> None:
        self._progress.console.print(markup, highlight=False)

    def sweep_started(self, total_cases: int) -> None:
        self._progress.update(self._cases, total=total_cases)

    def case_started(self, case_id: str, index: int, arms: int) -> None:
        self._index[case_id], self._case = index, case_id
        self._show_left()

    def arm_started(self, case_id: str, arm: str, arm_dir: Path, steps: int) -> None:
        key, index = (case_id, arm), self._index.get(case_id, 0)
        self._arm_dirs[key] = arm_dir
        label = f"  {escape(case_id)} / {escape(arm)}"
        if self._clock is not None:
            self._clock.arm_started(index, arm)
            if self._clock.skipped(index) is not None:
                return  # the launcher skips it at once: its outcome line says so
            label += escape(_estimate_text(self._clock.estimate(index, arm)))
        task = self._progress.add_task(label, total=steps)
        self._arms[key] = task

        def on_record(rec: StepRecord) -> None:
            self._progress.update(task, completed=rec.step, description=label + _loss_text(rec))
            self._show_left()

        self._followers[key] = StepFollower(rank_file(arm_dir, 0), on_record)

    def _stop_following(self, key: Optional[tuple[str, str]] = None) -> None:
        for k in [key] if key is not None else list(self._followers) + list(self._arms):
            follower = self._followers.pop(k, None)
            if follower is not None:
                follower.stop()
            task = self._arms.pop(k, None)
            if task is not None:
                self._progress.remove_task(task)
                self._progress.refresh()

    def arm_skipped(self, case_id: str, arm: str, reason: str) -> None:
        if self._clock is not None:
            self._clock.arm_ended(self._index.get(case_id, 0), arm)
        self._print(escape(f"{case_id} / {arm}: skipped ({reason})"))

    def arm_finished(self, case_id: str, arm: str, outcome: ArmOutcome) -> None:
        self._stop_following((case_id, arm))
        if self._clock is not None:
            self._clock.arm_ended(self._index.get(case_id, 0), arm,
                                  self._arm_dirs.get((case_id, arm)))
            self._show_left()
        style = "green" if outcome.ok else "red"
        self._print(f"{escape(case_id)} / {escape(arm)}: [{style}]{escape(outcome.describe())}[/{style}]")

    def case_finished(self, case_id: str, verdict: CaseVerdict) -> None:
        self._progress.advance(self._cases)
        style = {"pass": "green", "fail": "red"}.get(verdict.status, "yellow")
        self._print(f"{escape(case_id)}: [{style}]{verdict.status}[/{style}]")

    def close(self) -> None:
        self._stop_following()
        self._progress.stop()


def make_progress(stream: IO[str] = sys.stderr, plans: Sequence[CasePlan] = (),
                  history: Optional[Path] = None) -> SweepProgress:
    """Rich live progress on a terminal, plain lines otherwise; with the sweep's ``plans``, the
    time left, learnt from the sweep folder ``history`` (an earlier run here, where there is one)
    and the arms this sweep finishes."""
    clock = None
    if plans:
        clock = SuiteClock(plans, cuda_device_count(),
                           measure_sweep(history) if history is not None else ())
    if stream.isatty():
        return RichProgress(Console(file=stream), clock)
    return LineProgress(stream, clock=clock)
