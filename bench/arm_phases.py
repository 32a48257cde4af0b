"""Where a finished sweep's wall time went: one row per arm, split into phases, and the suite's
critical path.

Run from the repository root on the machine that ran the sweep (its files only are read; judging
is timed here, by judging each case again as ``dcp-harness gate`` does)::

    python bench/arm_phases.py SWEEP [--json OUT.json]

Per arm (``harness.results.timing``: the ranks' ``phases.rank<k>.json`` and the outcome's
launch-to-exit wall time): start (process created -> rank entry point), imports, rendezvous
(process groups; the CUDA context on CUDA), model build, setup (optimizer, data table), steps
(the records' step times, summed), checkpoint (saves and loads), records (appended and logged),
other (graph capture, memory probes, teardown), exit (spawning, interpreter exit, the launcher
between legs), wall. Per case: judging (``harness.judge.judge`` after ``trust.stored_plan.check_stored_plan``,
rules: what ``gate`` does for the case, timed here). Then the totals by phase, the sweep's report
writing (``summary.md`` written after the last ``verdict.json``), and the critical path: the
arms one after another (today's sweep), and with the arms of CPU ranks beside those of CUDA ranks
(the longer of the two lanes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from harness.caseplan import PLAN_FILE, read_plan  # noqa: E402
from harness.judge import judge, read_arms  # noqa: E402
from harness.results import SUMMARY_FILE, VERDICT_FILE  # noqa: E402
from harness.results.timing import (  # noqa: E402
                                    PHASES,
                                    ArmTiming,
                                    add_phases,
                                    arm_timing,
                                    checkpoint_rule,
                                    )
from harness.trust.stored_plan import check_stored_plan  # noqa: E402

COLUMNS = PHASES + ("exit", "wall")


@dataclass(frozen=True)
class ArmRow:
    case_id: str
    arm: str
    timing: ArmTiming

    @property
    def lane(self) -> str:
        """The device its ranks used: ``cuda`` or ``cpu`` (``-``: it did not run)."""
        device = self.timing.device or ""
        return "cuda" if "cuda" in device else ("cpu" if device else "-")


@dataclass(frozen=True)
class CaseRow:
    case_id: str
    arms: tuple[ArmRow, ...]
    judging_s: float


def sweep_rows(sweep: Path) -> list[CaseRow]:
    """Every case folder of ``sweep`` with a plan, its arms' timings and its judging time."""
    rows = []
    for case_dir in sorted(p for p in sweep.iterdir() if (p / PLAN_FILE).is_file()):
        plan = read_plan(case_dir)
        arms = tuple(
            ArmRow(plan.case_id, arm.name, arm_timing(
                case_dir / arm.name, checkpoint_rule(arm.case.train.checkpoint_every)))
            for arm in plan.arms if (case_dir / arm.name).is_dir())
        t0 = time.perf_counter()
        check_stored_plan(plan)  # what the gate does for a stored case: the plan checked, then
        judge(plan, read_arms(case_dir, plan))  # the case judged from its records
        rows.append(CaseRow(plan.case_id, arms, time.perf_counter() - t0))
    return rows


def _s(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def _cells(timing: ArmTiming) -> list[str]:
    return [_s(getattr(timing.phases, name)) for name in PHASES] + [_s(timing.exit),
                                                                    _s(timing.wall_s)]


def arm_table(rows: Sequence[CaseRow]) -> str:
    head = ["case / arm", "device", "ranks", "runs", "steps", "status", *COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in rows:
        for a in case.arms:
            t = a.timing
            cells = [f"{a.case_id} / {a.arm}", t.device or "-", str(t.ranks), str(t.runs),
                     str(t.steps), t.status, *_cells(t)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("| " + " | ".join([f"{case.case_id}: judging", *[""] * (len(head) - 2),
                                        _s(case.judging_s)]) + " |")
    return "\n".join(lines)


def _reports_s(sweep: Path) -> Optional[float]:
    """``summary.md`` written after the last ``verdict.json``: the sweep's report writing."""
    verdicts = [p.stat().st_mtime for p in sweep.glob(f"*/{VERDICT_FILE}")]
    summary = sweep / SUMMARY_FILE
    if not verdicts or not summary.is_file():
        return None
    return summary.stat().st_mtime - max(verdicts)


def totals(rows: Sequence[CaseRow], sweep: Path) -> str:
    arms = [a for case in rows for a in case.arms]
    phases = add_phases(a.timing.phases for a in arms)
    exit_s = sum(a.timing.exit or 0.0 for a in arms)
    wall = sum(a.timing.wall_s or 0.0 for a in arms)
    judging = sum(c.judging_s for c in rows)
    reports = _reports_s(sweep)
    lines = ["| phase | seconds | share of the arms' wall |", "|---|---|---|"]
    for name in PHASES:
        value = getattr(phases, name)
        lines.append(f"| {name} | {_s(value)} | {(value or 0.0) / wall:.0%} |" if wall else
                     f"| {name} | {_s(value)} | - |")
    lines.append(f"| exit | {exit_s:.2f} | {exit_s / wall:.0%} |" if wall else "| exit | - | - |")
    lines.append(f"| arms' wall (sum) | {wall:.2f} | |")
    lines.append(f"| judging (all cases, timed here) | {judging:.2f} | |")
    lines.append(f"| reports (summary.md after the last verdict) | {_s(reports)} | |")
    lanes: dict[str, float] = {}
    for a in arms:
        if a.lane != "-":
            lanes[a.lane] = lanes.get(a.lane, 0.0) + (a.timing.wall_s or 0.0)
    one_by_one = wall + judging + (reports or 0.0)
    side = max(lanes.values(), default=0.0) + judging + (reports or 0.0)
    lane_text = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(lanes.items()))
    return "\n".join(lines + [
        "",
        f"critical path, arms one after another (today): {one_by_one:.1f} s",
        f"critical path, CPU-rank arms beside CUDA-rank arms: {side:.1f} s (lanes: {lane_text})",
    ])


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path, help="a finished sweep folder (dcp-harness run --out)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT",
                   help="also write the rows as JSON to OUT")
    args = p.parse_args(argv)
    if not args.sweep.is_dir():
        print(f"error: {args.sweep} is not a folder; pass a sweep folder", file=sys.stderr)
        return 2
    rows = sweep_rows(args.sweep)
    if not rows:
        print(f"error: {args.sweep} holds no case folder with a {PLAN_FILE}; pass a sweep folder",
              file=sys.stderr)
        return 2
    print(arm_table(rows))
    print()
    print(totals(rows, args.sweep))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
