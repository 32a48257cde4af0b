"""The layout of a sweep folder: file names and where each file of a case and an arm lives.

::

    <sweep>/<case_id>/case.json
    <sweep>/<case_id>/plan.json                 harness.caseplan
    <sweep>/<case_id>/<arm>/rank<k>.jsonl     one JSON object per completed step
    <sweep>/<case_id>/<arm>/outcome.json      ArmOutcome
    <sweep>/<case_id>/<arm>/log.txt
    <sweep>/<case_id>/verdict.json            harness.compare.CaseVerdict
    <sweep>/<case_id>/judged.json             harness.judge.JudgedStamp (what it was judged from)
    <sweep>/summary.md, junit.xml, index.json, index.html
"""

from __future__ import annotations

import re
from pathlib import Path

from .files import PathLike

CASE_FILE = "case.json"
VERDICT_FILE = "verdict.json"
JUDGED_FILE = "judged.json"
KEPT_ROWS_FILE = "history-rows.json"  # the case's arm rows for the history, kept when judged
OUTCOME_FILE = "outcome.json"
LOG_FILE = "log.txt"
SUMMARY_FILE = "summary.md"
JUNIT_FILE = "junit.xml"
INDEX_FILE = "index.json"

RANK_FILE = re.compile(r"^rank(\d+)\.jsonl$")


def case_dir(sweep_dir: PathLike, case_id: str) -> Path:
    return Path(sweep_dir) / case_id


def arm_dir(sweep_dir: PathLike, case_id: str, arm: str) -> Path:
    return Path(sweep_dir) / case_id / arm


def rank_file(arm_dir_: PathLike, rank: int) -> Path:
    return Path(arm_dir_) / f"rank{rank}.jsonl"


def rank_files(arm_dir_: PathLike) -> dict[int, Path]:
    """Rank -> ``rank<k>.jsonl`` of every rank file in an arm folder (missing folder -> {})."""
    d = Path(arm_dir_)
    if not d.is_dir():
        return {}
    out = {int(m.group(1)): child for child in d.iterdir()
           if (m := RANK_FILE.match(child.name)) and child.is_file()}
    return dict(sorted(out.items()))


def list_arm_dirs(case_dir_: PathLike) -> dict[str, Path]:
    """Arm name -> folder for every sub-folder of a case holding an outcome or rank files."""
    d = Path(case_dir_)
    out: dict[str, Path] = {}
    if not d.is_dir():
        return out
    for child in sorted(d.iterdir()):
        if not child.is_dir():
            continue
        if (child / OUTCOME_FILE).is_file() or any(
            RANK_FILE.match(p.name) for p in child.iterdir()
        ):
            out[child.name] = child
    return out
