"""Small text formatters shared by the summary, the console table and JUnit."""

from __future__ import annotations

import math
from typing import Optional, Sequence

from harness.compare import Check, PairVerdict

from .load import ArmView, CaseView, worst_loss_delta

DASH = "-"


def fmt_num(x: Optional[float], digits: int = 5) -> str:
    if x is None:
        return DASH
    if math.isnan(x) or math.isinf(x):
        return repr(x)
    return f"{x:.{digits}g}"


def fmt_gib(x: Optional[float]) -> str:
    return DASH if x is None else f"{x / 1024 ** 3:.2f}"


def fmt_s(x: Optional[float]) -> str:
    return DASH if x is None else f"{x:.3f}"


def checks_cell(p: PairVerdict) -> str:
    """``passed/checks`` with the n/a checks and the figures (reported, not checks) said apart."""
    checks = [c for c in p.checks if not c.figure]
    na = sum(1 for c in checks if not c.applicable)
    figures = len(p.checks) - len(checks)
    notes = [f"{na} n/a"] * bool(na) + [f"{figures} figure{'s' * (figures != 1)}"] * bool(figures)
    text = f"{p.checks_passed}/{len(checks)}"
    return f"{text} ({', '.join(notes)})" if notes else text


def pair_arms(case: CaseView, p: PairVerdict) -> list[Optional[ArmView]]:
    return [case.arms.get(a) for a in p.arms]


def per_arm(case: CaseView, p: PairVerdict, fn) -> str:  # type: ignore[no-untyped-def]
    arms = pair_arms(case, p)
    if not arms:
        return DASH
    return " / ".join(fn(a) if a is not None else DASH for a in arms)


def final_loss_cell(case: CaseView, p: PairVerdict) -> str:
    if case.emulated:  # its ranks' own local figures, not the model's loss
        return DASH
    return per_arm(case, p, lambda a: fmt_num(a.figures.final_loss))


def peak_mem_cell(case: CaseView, p: PairVerdict, unit: bool = True) -> str:
    cell = per_arm(case, p, lambda a: fmt_gib(a.figures.peak_allocated_bytes))
    return DASH if set(cell.split(" / ")) == {DASH} else cell + (" GiB" if unit else "")


def step_time_cell(case: CaseView, p: PairVerdict, unit: bool = True) -> str:
    cell = per_arm(case, p, lambda a: fmt_s(a.figures.median_step_time_s))
    return DASH if set(cell.split(" / ")) == {DASH} else cell + (" s" if unit else "")


def loss_delta_cell(case: CaseView, p: PairVerdict) -> str:
    arms = pair_arms(case, p)
    if case.emulated:  # the checks compare them rank by rank
        return DASH
    if len(arms) != 2 or arms[0] is None or arms[1] is None:
        return DASH
    worst = worst_loss_delta(arms[0], arms[1])
    if worst is None:
        return DASH
    step, diff, rel = worst
    if diff == 0:
        return "0"
    return f"{diff:.2g} (rel {rel:.2g}, step {step})"


def check_line(c: Check) -> str:
    value = fmt_num(c.value, 4)
    bound = fmt_num(c.bound, 4)
    if c.lower is not None:
        bound = f"{fmt_num(c.lower, 4)}..{bound}"
    state = "passed" if c.passed else "FAILED"
    if not c.applicable:
        state = "n/a"
    if c.figure:
        state = "figure"
    return f"{c.name}: {state} (value {value}, bound{'s' if c.lower is not None else ''} {bound}): {c.detail}"


def failed_names(p: PairVerdict) -> list[str]:
    return [c.name for c in p.failed_checks]


def pair_title(p: PairVerdict) -> str:
    """``dcp_vs_fixed_cp (dcp vs fixed-cp2)``; the pair alone when it has no arms
    (``slot_ring-plan``: the planner's figures)."""
    return f"{p.pair} ({' vs '.join(p.arms)})" if p.arms else p.pair


def arm_causes(case: CaseView, p: PairVerdict) -> list[str]:
    """``arm 'eager' failed: ConfigError: step 1: ...`` for each arm of the entry that ended badly
    with a cause its rank's log names (``ArmOutcome.cause``)."""
    return [f"arm '{name}' {arm.outcome.status}: {arm.outcome.cause}"
            for name, arm in zip(p.arms, pair_arms(case, p))
            if arm is not None and arm.outcome is not None and not arm.outcome.ok
            and arm.outcome.cause]


def entry_why(case: CaseView, p: PairVerdict) -> str:
    """Why an entry did not pass, in one line: a failure's checks (and the cause of an arm that
    ended badly), an error's or a skip's reason (an arm's cause is in it: ``describe``)."""
    if p.status != "fail":
        return p.error or ""
    return "; ".join([", ".join(failed_names(p)), *arm_causes(case, p)])


def arm_report(arms: Sequence[Optional[ArmView]], names: Sequence[str]) -> str:
    """Per arm: outcome line, repro command and log tail (the JUnit system-out)."""
    blocks: list[str] = []
    for name, arm in zip(names, arms):
        if arm is None:
            blocks.append(f"== arm {name}: no results folder")
            continue
        head = f"== arm {name}: " + (arm.outcome.describe() if arm.outcome else "no outcome.json (never finished)")
        lines = [head]
        if arm.outcome and arm.outcome.restarts:
            lines.append(f"restarts: {arm.outcome.restarts}")
        if arm.problem:
            lines.append(f"problem: {arm.problem}")
        if arm.outcome and arm.outcome.repro:
            lines.append(f"repro: {arm.outcome.repro}")
        if arm.outcome and arm.outcome.log_tail:
            lines.append("log tail:")
            lines.append(arm.outcome.log_tail.rstrip("\n"))
        blocks.append("\n".join(lines))
    return "\n".join(blocks)
