"""What every backend does to a sweep folder: the manifest, the case folders, resuming, judging.

A sweep folder holds a case folder per case (``case.json``, ``plan.json``, an arm folder per arm,
``verdict.json``) and the sweep's ``manifest.json``. Whichever backend runs the cases (this
machine: ``local``; Slurm: ``slurm``), it writes the folder with these functions:
``check_resumable`` (a folder holding another case under the same id is refused),
``sweep_start`` / ``record_manifest`` (what the sweep is to hold, before any arm runs),
``prepare_case_dir`` (``case.json``, kept when resuming, and ``plan.json``, written every time so
a resumed sweep judges by the golden values as they are now), ``load_plan``,
``remove_checkpoints_if_complete`` (the one clean-up rule), and ``finalize_case`` /
``finalize_or_error`` (judge a case from its folder alone, ``harness.judge``, and write
``verdict.json`` and its stamp ``judged.json``; unreadable results an ``error`` verdict naming
the folder).
"""

from __future__ import annotations

import os
import shutil
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Sequence

from harness.caseplan import UNHASHED_FIELDS, CasePlan, PlannedArm, read_plan, write_plan
from harness.compare import (
    ARM_CHECKS_CONTRACT,
    ARM_CHECKS_PAIR,
    CaseVerdict,
    PairVerdict,
    write_verdict,
)
from harness.errors import ConfigError
from harness.history.extract import arm_rows
from harness.judge import judge, read_arms, write_stamp
from harness.launch.ranks.completion import arm_is_complete
from harness.launch.ranks.rank_main import CHECKPOINT_DIR
from harness.report.load import load_arms
from harness.results import (
    CASE_FILE,
    KEPT_ROWS_FILE,
    ResultsError,
    SweepStart,
    add_to_manifest,
    inherited,
    read_json,
    write_bytes_atomic,
    write_json_atomic,
)
from harness.results.code import HARNESS_REPO, code_versions
from harness.spec.command import command_dir
from harness.spec.schema import Case


# --------------------------------------------------------------------------- case folders
def _comparable(dump: Any) -> Any:
    if isinstance(dump, dict):
        return {k: v for k, v in dump.items() if k not in UNHASHED_FIELDS}
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


def sweep_start(command: str, cases: Sequence[Case], gpus: int, *, paths: Sequence[str] = (),
                k: Optional[str] = None, tags: Optional[Sequence[str]] = None,
                emulate_ranks: Optional[str] = None, label: Optional[str] = None) -> SweepStart:
    """The manifest's record of one ``run`` or ``submit``: what it selected, where it ran, the
    history label it asked for."""
    return SweepStart(command=command, started=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      paths=tuple(str(p) for p in paths), k=k,
                      tags=tuple(tags) if tags is not None else None, emulate_ranks=emulate_ranks,
                      host=socket.gethostname(), gpus=gpus, cases=tuple(c.id for c in cases),
                      environment=inherited(os.environ, [n for c in cases if c.command is not None
                                                         for n in c.command.secret_env]),
                      code=code_versions({c.id: code_folder(c) for c in cases}), label=label)


def code_folder(case: Case) -> Path:
    """The folder of the code a case runs: its command's for a command case, else this
    repository's (``harness.results.code``)."""
    return command_dir(case.source, case.command) if case.command is not None else HARNESS_REPO


def record_manifest(plans: Sequence[CasePlan], out_dir: Path,
                    start: Optional[SweepStart] = None) -> None:
    """List ``plans`` (and the invocation ``start``) in the sweep's manifest, before any of them
    runs: the gate then knows what the sweep is to hold (``harness.results.manifest``)."""
    add_to_manifest(out_dir, [p.manifest_entry() for p in plans], start)


def prepare_case_dir(plan: CasePlan, out_dir: Path, *, listed: bool = False) -> Path:
    """Create ``<out_dir>/<case id>/`` with ``case.json`` (kept when it is there: a resumed
    sweep) and ``plan.json`` (written every time, so a resumed sweep judges by the golden values
    as they are now), listed in the manifest; the case folder. ``listed``: the caller has
    already checked the sweep's cases (``check_resumable``) and listed them
    (``record_manifest``), as both backends do for all of them before any runs; the manifest is
    then not read again for each case (a sweep of 1,000 cases re-read it 1,000 times: 250 s)."""
    if not listed:
        check_resumable([plan.case], out_dir)
    case_dir = Path(out_dir) / plan.case_id
    case_dir.mkdir(parents=True, exist_ok=True)
    path = case_dir / CASE_FILE
    if not path.is_file():
        write_json_atomic(path, plan.case.model_dump(mode="json"))
    write_plan(case_dir, plan)
    if not listed:
        record_manifest([plan], out_dir)
    return case_dir


def load_plan(case_dir: Path) -> CasePlan:
    """The plan of a case folder (``harness.caseplan.read_plan``)."""
    return read_plan(case_dir)


def remove_checkpoints_if_complete(arm: PlannedArm, arm_dir: Path) -> bool:
    """Remove ``<arm>/checkpoint`` once the arm is complete (nothing left to resume): the one
    rule for local sweeps (after each arm) and Slurm sweeps (``collect``). True when removed."""
    if not arm_is_complete(arm, arm_dir):
        return False
    shutil.rmtree(Path(arm_dir) / CHECKPOINT_DIR, ignore_errors=True)
    return True


def finalize_case(case_dir: Path) -> CaseVerdict:
    """Judge a case from its folder alone (its plan, outcomes and step records:
    ``harness.judge``) and write ``verdict.json``, then the rows the history keeps of its arms
    (``KEPT_ROWS_FILE``: ``history.extract.arm_rows`` of the records just read) and the stamp
    of both. The gate checks the verdict with the same judge; `history add` takes verdict and
    rows while the stamp is current."""
    case_dir = Path(case_dir)
    plan = load_plan(case_dir)
    files = read_arms(case_dir, plan)
    verdict = judge(plan, files, sweep_dir=str(case_dir.resolve().parent))
    write_verdict(case_dir, verdict)
    rows = arm_rows(plan.case_id, bool(plan.case.emulated_ranks), load_arms(case_dir, files))
    write_bytes_atomic(case_dir / KEPT_ROWS_FILE, rows.encoded())
    write_stamp(case_dir, plan)  # what it was judged from: `history add` takes it while current
    return verdict


def finalize_or_error(case_id: str, case_dir: Path) -> CaseVerdict:
    """:func:`finalize_case`, or, when the folder's results cannot be read, an ``error`` verdict
    naming the folder and why (written too)."""
    try:
        return finalize_case(case_dir)
    except (ResultsError, ValueError, KeyError, OSError) as exc:  # unreadable results: an error
        pair = PairVerdict(case_id, ARM_CHECKS_PAIR, ARM_CHECKS_CONTRACT, (), (), "error",
                           f"could not evaluate {case_dir}: {type(exc).__name__}: {exc}")
        verdict = CaseVerdict(case_id, (pair,), "error")
        write_verdict(case_dir, verdict)
        return verdict
