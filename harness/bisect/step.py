"""One step: a sweep of the selected cases at one commit, through the ``dcp-harness`` command
line (the same ``run`` / ``submit --wait`` a user runs), and its verdict.

The oracle is the harness's own verdict, from two sources that must agree: the exit code of the
step's ``run`` / ``submit --wait`` (the gate's) and the sweep folder it wrote. Exit 0 with a judged
case is **good**; exit 1 with a case whose ``verdict.json`` says ``fail`` is **bad**; anything else
(exit 2: an error or infrastructure failure, a crash with its traceback's exit 1 and no failing
verdict, a signal, a sweep with nothing judged) is **skip**, as ``git bisect run``'s exit 125.

The verdict files are read as plain JSON (``status``, each entry's failing checks), not through
this version's typed reader: a step's sweep is written by whatever harness that commit runs, and
an older one may have written fields this one does not know.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from harness.bisect.search import Verdict
from harness.results.paths import VERDICT_FILE

LOG_FILE = "step.log"  # everything the step's dcp-harness printed
STOP_GRACE_S = 120.0  # after Ctrl-C: how long the step's dcp-harness may take to stop its ranks


@dataclass(frozen=True)
class FailedCheck:
    case: str
    pair: str
    check: str
    value: Any
    bound: Any
    detail: str

    def line(self) -> str:
        bound = "" if self.bound is None else f" (bound {self.bound})"
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.case} / {self.pair} / {self.check}: {self.value}{bound}{detail}"


@dataclass(frozen=True)
class Judged:
    verdict: Verdict
    exit_code: Optional[int]
    detail: str


def _verdicts(sweep: Path) -> list[Mapping[str, Any]]:
    """Every case verdict of the sweep that reads as a JSON object (others are passed over)."""
    out = []
    for path in sorted(sweep.glob(f"*/{VERDICT_FILE}")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out.append(data)
    return out


def failing_checks(sweep: Path) -> list[FailedCheck]:
    """The failed checks of every failed entry of the sweep's cases (an entry that failed without
    a failed check, e.g. a pair's error, is listed with its error)."""
    out = []
    for verdict in _verdicts(sweep):
        case = str(verdict.get("case_id", "?"))
        for entry in verdict.get("pairs") or ():
            if not isinstance(entry, dict) or entry.get("status") != "fail":
                continue
            pair = str(entry.get("pair", "?"))
            failed = [c for c in entry.get("checks") or () if isinstance(c, dict)
                      and c.get("passed") is False]
            out += [FailedCheck(case, pair, str(c.get("name", "?")), c.get("value"),
                                c.get("bound"), str(c.get("detail") or "")) for c in failed]
            if not failed:
                error = str(entry.get("error") or "")
                out.append(FailedCheck(case, pair, "(entry)", None, None, error))
    return out


def _last_line(log: Path) -> str:
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
        lines = [ln.strip() for ln in text.splitlines()]
    except OSError:
        return ""
    errors = [ln for ln in lines if ln.startswith("error") or "Error" in ln]
    shown = errors[-1] if errors else next((ln for ln in reversed(lines) if ln), "")
    return shown[:300]


def judge(exit_code: Optional[int], sweep: Path, log: Path) -> Judged:
    """The step's verdict from its exit code and sweep folder (module doc)."""
    statuses = [v.get("status") for v in _verdicts(sweep)]
    where = f"see {log}"
    if exit_code == 0 and statuses:
        return Judged(Verdict.GOOD, 0, f"{len(statuses)} case(s) judged, none failed")
    if exit_code == 1 and "fail" in statuses:
        failed = failing_checks(sweep)
        return Judged(Verdict.BAD, 1, f"{len(failed)} failed check(s): "
                      + "; ".join(f.line() for f in failed[:3])[:500])
    if exit_code == 0:
        why = "exit 0 but the sweep holds no verdict (nothing was judged)"
    elif exit_code == 1:
        why = "exit 1 but no case verdict says fail: a crash, not a regression"
    elif exit_code is None or exit_code < 0:
        why = f"ended by signal {-(exit_code or 0)}"
    else:
        why = f"exit {exit_code} (an error or infrastructure failure)"
    last = _last_line(log)
    detail = f"{why}: {last} ({where})" if last else f"{why} ({where})"
    return Judged(Verdict.SKIP, exit_code, detail)


def run_command(argv: Sequence[str], cwd: Path, env: Mapping[str, str], log: Path) -> int:
    """Run the step's ``dcp-harness`` with its output in ``log``; its exit code. It runs in a
    session of its own, so a Ctrl-C at the terminal reaches only bisect, which passes ONE SIGINT
    on (the step stops its ranks as it would for a Ctrl-C of its own), waits up to
    ``STOP_GRACE_S`` and then kills what is left; the KeyboardInterrupt goes on up."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"$ (cd {cwd} && {' '.join(argv)})\n".encode())
        out.flush()
        proc = subprocess.Popen(list(argv), cwd=str(cwd), env=dict(env), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            _stop(proc)
            raise


def _stop(proc: subprocess.Popen) -> None:
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    except ProcessLookupError:
        pass
