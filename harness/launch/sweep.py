"""A sweep: cases x arms, run by a launcher, judged, reported; re-running it resumes.

For each case: ``prepare_case_dir`` writes ``case.json``; each arm runs unless its outcome says
``ok`` and every rank holds every step (an arm that failed, timed out or was interrupted runs again
and resumes after its last checkpointed step); ``finalize_case`` evaluates the pairs and writes
``verdict.json``. At the end ``write_reports`` writes ``summary.md``, ``junit.xml``, ``index.json``.
A failing arm never stops the sweep; only Ctrl-C does.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Protocol, Sequence

from harness.arms import Arm, arms_for_case
from harness.compare import ARM_CHECKS_PAIR, CaseVerdict, PairVerdict, evaluate_case, write_verdict
from harness.errors import ConfigError
from harness.launch.rules import case_rules
from harness.launch.progress import NullProgress, SweepProgress
from harness.launch.rank_main import CHECKPOINT_DIR
from harness.results import (
    CASE_FILE,
    OUTCOME_FILE,
    VERDICT_FILE,
    ArmOutcome,
    ResultsError,
    read_json,
    read_outcome,
    read_steps,
    write_json_atomic,
    write_outcome,
)
from harness.spec.schema import Case

# case.json fields that do not change what runs (a folder can be run from another directory).
_IGNORED_FIELDS = ("source",)
LOCK_FILE = ".run.lock"


class ArmLauncher(Protocol):
    """Runs every rank of one arm and reports how it ended (never raises for a failing arm)."""

    def run_arm(self, case: Case, arm: Arm, arm_dir: Path, case_json: Path) -> ArmOutcome: ...


@dataclass(frozen=True)
class SweepResult:
    out_dir: Path
    verdicts: tuple[CaseVerdict, ...]
    arms_run: int
    arms_skipped: int
    summary: Any = None  # what harness.report.write_reports returned (for console_table)


# --------------------------------------------------------------------------- case folders
def _comparable(dump: Any) -> Any:
    if isinstance(dump, dict):
        return {k: v for k, v in dump.items() if k not in _IGNORED_FIELDS}
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


def prepare_case_dir(case: Case, out_dir: Path) -> Path:
    """Create ``<out_dir>/<case.id>/`` with ``case.json``; the case folder."""
    check_resumable([case], out_dir)
    case_dir = Path(out_dir) / case.id
    case_dir.mkdir(parents=True, exist_ok=True)
    path = case_dir / CASE_FILE
    if not path.is_file():
        write_json_atomic(path, case.model_dump(mode="json"))
    return case_dir


def load_case(case_dir: Path) -> Case:
    return Case.model_validate(read_json(Path(case_dir) / CASE_FILE))


def arm_is_complete(case: Case, arm_dir: Path) -> bool:
    """The arm's outcome says ok and every rank recorded every step."""
    outcome = read_outcome(arm_dir)
    if outcome is None or not outcome.ok:
        return False
    steps = read_steps(arm_dir)
    want = set(range(1, case.train.steps + 1))
    return all(want <= {r.step for r in steps.get(rank, [])}
               for rank in range(case.layout.world))


def remove_checkpoints_if_complete(case: Case, arm_dir: Path) -> bool:
    """Remove ``<arm>/checkpoint`` once the arm is complete (nothing left to resume): the one
    rule for local sweeps (after each arm) and Slurm sweeps (``collect``). True when removed."""
    if not arm_is_complete(case, arm_dir):
        return False
    shutil.rmtree(Path(arm_dir) / CHECKPOINT_DIR, ignore_errors=True)
    return True


def finalize_case(case_dir: Path) -> CaseVerdict:
    """Evaluate a case from its folder alone and write ``verdict.json``."""
    case_dir = Path(case_dir)
    case = load_case(case_dir)
    rules = case_rules(case.model_dump(mode="json"))  # the one rule the gate re-judges with
    arm_data = {}
    for name in rules.arms:
        arm_dir = case_dir / name
        if arm_dir.is_dir():
            arm_data[name] = (read_outcome(arm_dir), read_steps(arm_dir))
    # Each arm runs its own derived case's world size (the reference arm runs one rank).
    verdict = evaluate_case(case.id, rules.pairs, arm_data, expected_steps=rules.expected_steps,
                            expected_ranks=rules.expected_ranks, sanity=rules.sanity)
    write_verdict(case_dir, verdict)
    return verdict


# --------------------------------------------------------------------------- the sweep
@contextmanager
def sweep_lock(out_dir: Path) -> Iterator[None]:
    """Hold ``<out_dir>/.run.lock`` while a sweep writes there: a second ``dcp-harness run`` into
    the same folder (resuming while the first still runs) would run the same arms twice into the
    same files. ConfigError when another process holds it (released when that one exits)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / LOCK_FILE, "a+", encoding="utf-8") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise ConfigError(f"{out_dir} is being written by another sweep ({holder}); wait for "
                              "it to end or pass another --out") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        try:
            yield
        finally:
            fh.truncate(0)
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run_one(launcher: ArmLauncher, case: Case, arm: Arm, arm_dir: Path,
             case_json: Path) -> ArmOutcome:
    (arm_dir / OUTCOME_FILE).unlink(missing_ok=True)  # no stale outcome for an arm in flight
    try:
        return launcher.run_arm(case, arm, arm_dir, case_json)
    except Exception as exc:  # the launcher itself broke: record it, keep sweeping
        return ArmOutcome(status="infra", detail=f"launcher raised {type(exc).__name__}: {exc}",
                          log_tail=traceback.format_exc())


def _finalize_or_error(case: Case, case_dir: Path) -> CaseVerdict:
    try:
        return finalize_case(case_dir)
    except (ResultsError, ValueError, KeyError, OSError) as exc:  # unreadable results: an error
        pair = PairVerdict(case.id, ARM_CHECKS_PAIR, "arm_checks", (), (), "error",
                           f"could not evaluate {case_dir}: {type(exc).__name__}: {exc}")
        verdict = CaseVerdict(case.id, (pair,), "error")
        write_verdict(case_dir, verdict)
        return verdict


def run_sweep(cases: Sequence[Case], out_dir: Path, launcher: ArmLauncher,
              progress: Optional[SweepProgress] = None) -> SweepResult:
    """Run every arm of every case into ``out_dir`` (resuming), judge each case, write reports."""
    from harness.report import write_reports

    out_dir = Path(out_dir)
    check_resumable(cases, out_dir)
    with sweep_lock(out_dir):
        verdicts, ran, skipped = _run_cases(cases, out_dir, launcher, progress or NullProgress())
        summary = write_reports(out_dir, rules=case_rules)  # judged as the gate judges
    return SweepResult(out_dir=out_dir, verdicts=tuple(verdicts), arms_run=ran,
                       arms_skipped=skipped, summary=summary)


def _run_cases(cases: Sequence[Case], out_dir: Path, launcher: ArmLauncher,
               shown: SweepProgress) -> tuple[list[CaseVerdict], int, int]:
    verdicts: list[CaseVerdict] = []
    ran = skipped = 0
    shown.sweep_started(len(cases))
    try:
        for index, case in enumerate(cases):
            case_dir = prepare_case_dir(case, out_dir)
            arms = arms_for_case(case)
            shown.case_started(case.id, index, len(arms))
            for arm in arms:
                arm_dir = case_dir / arm.name
                if arm_is_complete(arm.case, arm_dir):
                    skipped += 1
                    shown.arm_skipped(case.id, arm.name, "already complete")
                    continue
                (case_dir / VERDICT_FILE).unlink(missing_ok=True)
                arm_dir.mkdir(parents=True, exist_ok=True)
                shown.arm_started(case.id, arm.name, arm_dir, case.train.steps)
                outcome = _run_one(launcher, case, arm, arm_dir, case_dir / CASE_FILE)
                write_outcome(arm_dir, outcome)
                remove_checkpoints_if_complete(arm.case, arm_dir)  # finished for good: no resume
                ran += 1
                shown.arm_finished(case.id, arm.name, outcome)
            verdict = _finalize_or_error(case, case_dir)
            verdicts.append(verdict)
            shown.case_finished(case.id, verdict)
    finally:
        shown.close()
    return verdicts, ran, skipped
