"""index.json: the machine-readable view of a sweep (cases, pairs, statuses, paths)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

from harness.results import (
    CASE_FILE,
    INDEX_FILE,
    JUNIT_FILE,
    OUTCOME_FILE,
    SUMMARY_FILE,
    VERDICT_FILE,
    rank_file,
    record_json,
)

from harness.sites import sites_file

from .load import ArmView, CaseView, SweepView
from .page import PAGE_FILE

INDEX_VERSION = 1


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _arm(arm: ArmView, root: Path, case: CaseView) -> dict[str, Any]:
    f = arm.figures
    return {
        "emulated": list(case.labels) if case.emulated else None,
        "dir": _rel(arm.dir, root),
        "status": arm.outcome.status if arm.outcome else None,
        "returncode": arm.outcome.returncode if arm.outcome else None,
        "wall_s": arm.outcome.wall_s if arm.outcome else None,
        "restarts": arm.outcome.restarts if arm.outcome else None,
        "repro": arm.outcome.repro if arm.outcome else None,
        "outcome": _rel(arm.dir / OUTCOME_FILE, root) if arm.outcome else None,
        "log": _rel(arm.log, root) if arm.log else None,
        "ranks": {str(k): _rel(rank_file(arm.dir, k), root) for k in sorted(arm.steps)},
        "sites": {str(k): _rel(sites_file(arm.dir, k), root) for k in sorted(arm.sites)},
        "problem": arm.problem,
        "figures": {
            "steps": f.steps,
            # an emulated rank's loss is its own local figure, not the model's
            "final_loss": None if case.emulated else f.final_loss,
            "peak_allocated_bytes": f.peak_allocated_bytes,
            "peak_reserved_bytes": f.peak_reserved_bytes,
            "median_step_time_s": f.median_step_time_s,
        },
    }


def build_index(sweep: SweepView, exit_code: int, generated_at: datetime,
                plots: Sequence[Path] = ()) -> dict[str, Any]:
    root = sweep.sweep_dir
    plot_by_case = {p.stem: _rel(p, root) for p in plots}
    cases = []
    for case in sweep.cases:
        cases.append({
            "id": case.case_id,
            "title": case.title,
            # each emulated rank alone on one device, loopback communication (None: real ranks)
            "emulated": ({"ranks": list(case.emulated_ranks), "world": case.world,
                          "labels": list(case.labels)} if case.emulated else None),
            "status": case.verdict.status,
            "dir": _rel(case.dir, root),
            "case_json": _rel(case.dir / CASE_FILE, root) if (case.dir / CASE_FILE).is_file() else None,
            "verdict_json": _rel(case.dir / VERDICT_FILE, root) if case.verdict_found else None,
            "tags": list(case.tags),
            "parked": record_json(case.parked.entry) if case.parked is not None else None,
            "plot": plot_by_case.get(case.case_id),
            "arms": {name: _arm(arm, root, case) for name, arm in case.arms.items()},
            "pairs": [{
                "name": p.pair,
                "title": case.mark(p.pair),
                "contract": p.contract,
                "arms": list(p.arms),
                "status": p.status,
                "error": p.error,
                "checks_passed": p.checks_passed,
                "checks_total": len(p.checks),
                "failed_checks": [c.name for c in p.failed_checks],
                "not_applicable": [c.name for c in p.checks if not c.applicable],
            } for p in case.verdict.pairs],
        })
    return {
        "version": INDEX_VERSION,
        "sweep": sweep.name,
        "generated_at": generated_at.replace(microsecond=0).isoformat(),
        "status": sweep.status,
        "exit_code": exit_code,
        "counts": sweep.counts(),
        "warnings": [w.strip() for w in sweep.warnings()],
        "reports": {"summary": SUMMARY_FILE, "junit": JUNIT_FILE, "index": INDEX_FILE, "page": PAGE_FILE,
                    "plots": sorted(plot_by_case.values())},
        "cases": cases,
    }

