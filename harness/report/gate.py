"""The merge gate: 0 all pass, 1 a check failed (regression), 2 errors without failures."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional, Sequence, TextIO

from harness.compare import DEFAULT_ALLOWED_SKIPS
from harness.results import PathLike, lock_holder

from .env_notes import environment_notes
from .load import PlanCheck, SweepView, load_sweep
from .text import entry_why

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_ERROR = 2


@dataclass(frozen=True)
class GateResult:
    code: int
    message: str


def exit_code(sweep: SweepView) -> int:
    if not sweep.cases:
        return EXIT_ERROR
    # A sweep where nothing ran (every entry skipped) proves nothing: an error, not a pass.
    return {"pass": EXIT_PASS, "fail": EXIT_FAIL, "error": EXIT_ERROR,
            "skipped": EXIT_ERROR}[sweep.status]


def gate_result(sweep: SweepView) -> GateResult:
    where = sweep.sweep_dir
    if not sweep.exists:
        return GateResult(EXIT_ERROR, f"gate: no sweep folder at {where}; run "
                                      f"`dcp-harness run CASES --out {where}` first")
    if not sweep.cases:
        return GateResult(EXIT_ERROR, f"gate: {where} holds no case folders (case.json or "
                                      "verdict.json); nothing was run, so nothing can pass")
    code = exit_code(sweep)
    lines = [headline(sweep, code)]
    lines += [f"  ERROR {problem}" for problem in sweep.problems]
    skipped: dict[tuple[str, str], list[str]] = {}  # (case, [kind] reason) -> its skipped entries
    for case, p in sweep.rows:  # a case of emulated ranks is named with them (case.title)
        if case.parked is not None:
            continue  # one line per parked case, below
        if p.status == "fail":  # the failed checks, and the cause of an arm that ended badly
            lines.append(f"  FAIL  {case.title} / {p.pair}: "
                         f"{entry_why(case, p) or '(no check named)'}")
        elif p.status == "error":
            lines.append(f"  ERROR {case.title} / {p.pair}: {p.error}")
        elif p.status == "skipped":
            skipped.setdefault((case.title, f"[{p.skip}] {p.error or 'skipped'}"), []).append(p.pair)
    # One line per case and reason (a case skipped here has every entry skipped for one reason).
    lines += [f"  SKIP  {cid} / {', '.join(pairs)}: {why}" for (cid, why), pairs in skipped.items()]
    lines += [c.parked.line(c.title) for c in sweep.parked if c.parked is not None]
    lines += list(sweep.warnings())
    lines += [f"  NOTE  {note}" for note in environment_notes(sweep)]
    return GateResult(code, "\n".join(lines))


def headline(sweep: SweepView, code: int) -> str:
    """``gate: PASS (exit 0): N case(s), M verdict entries: ... pass, ... fail, ...``."""
    c = sweep.counts()
    head = (f"gate: {sweep.status.upper()} (exit {code}): {c['cases']} case(s), {c['entries']} "
            f"verdict entries: {c['pass']} pass, {c['fail']} fail, {c['error']} error, "
            f"{c['skipped']} skipped")
    kinds = sweep.skip_counts()
    if kinds:
        head += (" (" + ", ".join(f"{k} {n}" for k, n in kinds.items()) + "; accepted: "
                 + ", ".join(sweep.allowed_skips) + ")")
    if c["parked"]:
        head += (f", {c['parked']} parked (not counted"
                 + (f"; {c['xpass']} case(s) XPASS" if c["xpass"] else "") + ")")
    bounds = sweep.golden_bounds()
    if bounds:  # how the golden loss checks were judged; a fallback is not bitwise (its detail says why)
        head += ("; golden loss checks: " + ", ".join(
            f"{n} {'at a fallback bound' if k == 'fallback' else k}" for k, n in bounds.items()))
    if sweep.status == "skipped":
        head += "; nothing ran here, so nothing passed (run it where the cases can run)"
    emulated = [c.title for c in sweep.cases if c.emulated]
    if emulated:
        head += (f"; {len(emulated)} case(s) of emulated ranks (each rank alone on one device, "
                 f"loopback communication; not a multi-GPU run): {'; '.join(emulated)}")
    return head


def gate(sweep_dir: PathLike, out: Optional[TextIO] = None, check_plan: Optional[PlanCheck] = None,
         allowed_skips: Sequence[str] = DEFAULT_ALLOWED_SKIPS, as_is: bool = False) -> int:
    """Judge a sweep from its folder alone (each case by its stored plan, ``check_plan`` checking
    the plan first, against the sweep's manifest; each verdict checked against the step records)
    and print one summary line (plus one per failed, errored or skipped entry) to ``out``
    (default stdout). A sweep whose run lock is held is an error unless ``as_is``. Returns the
    exit code."""
    running = None if as_is else lock_holder(sweep_dir)
    result = gate_result(load_sweep(sweep_dir, check_plan, allowed_skips=allowed_skips,
                                    running=running))
    print(result.message, file=out if out is not None else sys.stdout)
    return result.code
