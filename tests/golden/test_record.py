"""``harness.golden.record``: the recording workflow runs its repeats through the ``ArmRuns`` it is
given (no launcher of its own), resumes complete ones, and records nothing when a repeat fails;
a hand-made sweep folder, repeats that copy the sweep's records (a deterministic CPU run repeats
them bitwise), no rank processes. The same workflow through the CLI on real CPU runs:
tests/launch/test_golden_record_e2e.py, tests/launch/test_golden_repeats_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

from harness.caseplan import CasePlan, PlannedArm
from harness.compare import Pair
from harness.golden import golden_file
from harness.golden.record import (NOT_RECORDED, REPEATS_DIR, WRITTEN, ArmRuns, CaseRecorded,
                                   Recording, record_sweep)
from harness.launch.ranks.completion import arm_is_complete
from harness.results import CASE_FILE, ArmOutcome, read_steps, write_outcome

from tests.records import record, write_steps
from tests.sweeps import hand_case

STEPS = 4


class CopyRun:
    """Runs an arm again as a deterministic CPU run does: the sweep's records, again (``status``
    other than ok: the run fails after its first step). Remembers where each run went."""

    def __init__(self, sweep_arm: Path, status: str = "ok") -> None:
        self.sweep_arm, self.status = sweep_arm, status
        self.calls: list[tuple[str, Path, Path]] = []

    def __call__(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
                 case_json: Path) -> ArmOutcome:
        self.calls.append((arm.name, arm_dir, case_json))
        steps = read_steps(self.sweep_arm)
        write_steps(arm_dir, steps if self.status == "ok" else {r: s[:1] for r, s in steps.items()})
        outcome = ArmOutcome(self.status, returncode=0 if self.status == "ok" else 1)
        write_outcome(arm_dir, outcome)
        return outcome


def golden_sweep(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(sweep, case folder, golden folder): one case whose eager arm ran ok and has a golden pair."""
    sweep, golden = tmp_path / "sweep", tmp_path / "golden"
    pair = Pair("golden", "golden", ("eager",),
                {"golden_dir": str(golden), "case_id": "c1", "steps": STEPS})
    case_dir = hand_case(sweep, "c1", [pair], ["eager"], steps=STEPS, ranks=1)
    write_steps(case_dir / "eager", {0: [record(s, loss=2.5 - 0.1 * s) for s in range(1, STEPS + 1)]})
    write_outcome(case_dir / "eager", ArmOutcome("ok", returncode=0))
    return sweep, case_dir, golden


def record_case(sweep: Path, case_dir: Path, run: CopyRun, repeats: int) -> tuple[CaseRecorded, list[str]]:
    said: list[str] = []
    (done,) = record_sweep(sweep, [case_dir], Recording(repeats=repeats),
                           ArmRuns(run=run, complete=arm_is_complete), said.append)
    return done, said


def test_repeats_run_through_the_runs_given_and_resume(tmp_path: Path) -> None:
    sweep, case_dir, golden = golden_sweep(tmp_path)
    run = CopyRun(case_dir / "eager")
    done, said = record_case(sweep, case_dir, run, repeats=3)
    assert done.result == WRITTEN and done.case_id == "c1"
    root = sweep / REPEATS_DIR / "c1"
    assert run.calls == [("eager", root / f"repeat{k}" / "eager", case_dir / CASE_FILE)
                         for k in (2, 3)]
    assert [line for line in said if line.startswith("      c1: ")] == [
        f"      c1: repeat {k}/3 of arm 'eager' -> {root / f'repeat{k}' / 'eager'}" for k in (2, 3)]
    path = golden_file(golden, "c1", "cpu")
    assert said[-1].startswith(f"wrote {path} (arm eager, platform cpu, {STEPS} steps, 3 run(s)")
    loss = json.loads(path.read_text())["lm loss"]
    assert loss["repeats"] == 3 and loss["min"] == loss["max"] == loss["values"]
    # complete repeats are not run again
    run.calls.clear()
    done, said = record_case(sweep, case_dir, run, repeats=3)
    assert done.result == WRITTEN and run.calls == []
    assert f"      c1: repeat 2/3 of arm 'eager' already complete ({root / 'repeat2' / 'eager'})" in said


def test_a_failing_repeat_records_nothing_and_says_which(tmp_path: Path) -> None:
    sweep, case_dir, golden = golden_sweep(tmp_path)
    run = CopyRun(case_dir / "eager", status="failed")
    done, said = record_case(sweep, case_dir, run, repeats=3)
    assert done.result == NOT_RECORDED
    assert len(run.calls) == 1  # the first failing repeat ends the case
    log = sweep / REPEATS_DIR / "c1" / "repeat2" / "eager" / "log.txt"
    assert said[-1] == (f"ERROR c1: repeat 2 of arm 'eager' failed after 0.0 s (returncode 1) "
                        f"(log: {log}); not recorded")
    assert not golden_file(golden, "c1", "cpu").exists()
