"""summary.md: one table row per case x pair, then the failures and errors in detail."""

from __future__ import annotations

from harness.compare import JUDGED, PairVerdict, comparisons
from harness.results.placement import read_placement

from .emulated import emulated_sections
from .env_notes import environment_notes
from .load import CaseView, SweepView
from .text import (
    check_line,
    checks_cell,
    entry_why,
    final_loss_cell,
    loss_delta_cell,
    pair_title,
    peak_mem_cell,
    step_time_cell,
)


def _md(text: str) -> str:
    """A table cell: pipes escaped, one line."""
    return _line(text).replace("|", "\\|")


def _line(text: str) -> str:
    return " ".join(text.split("\n"))


def render_summary(sweep: SweepView, exit_code: int) -> str:
    """summary.md: the counts, one table row per case x pair, then sections of figures,
    groupings, failures, errors, parked and skipped entries (each only where it has one)."""
    out = _header(sweep, exit_code)
    if not sweep.cases:
        out.append("No case folders found (a case folder holds case.json or verdict.json).")
        return "\n".join(out) + "\n"
    out += _table(sweep)
    out += emulated_sections(sweep)
    for section in (_figures, _comparison_sections, _failures_and_errors, _parked, _skipped):
        section(sweep, out)
    return "\n".join(out).rstrip("\n") + "\n"


def _header(sweep: SweepView, exit_code: int) -> list[str]:
    """The title, the status line with the counts, the sweep's warnings and environment notes."""
    counts = sweep.counts()
    out = [f"# dcp-harness sweep `{sweep.name}`", ""]
    parked = (f", {counts['parked']} parked (not counted by the gate"
              + (f"; {counts['xpass']} case(s) XPASS" if counts["xpass"] else "") + ")"
              if counts["parked"] else "")
    out.append(
        f"**{sweep.status.upper()}** (gate exit {exit_code}): {counts['cases']} case(s), "
        f"{counts['entries']} verdict entr{'y' if counts['entries'] == 1 else 'ies'}: "
        f"{counts['pass']} pass, {counts['fail']} fail, {counts['error']} error, "
        f"{counts['skipped']} skipped{parked}."
    )
    out.append("")
    out += [f"> **warning**: {w.strip()[len('WARN  '):]}" for w in sweep.warnings()]
    if sweep.warnings():
        out.append("")
    notes = environment_notes(sweep)
    out += [f"> **note**: {_line(note)}" for note in notes]
    if notes:
        out.append("")
    placed = read_placement(sweep.sweep_dir)
    if placed is not None:  # how the local GPU lane placed the arms (harness.results.placement)
        out += [f"> **placement**: {placed.summary()}", ""]
    return out


def _table(sweep: SweepView) -> list[str]:
    """One row per case x pair."""
    out: list[str] = []
    out.append("Figures per arm, in pair order (candidate / reference); memory is the peak "
               "`max_allocated_bytes` over ranks (CUDA only); step time is the median over steps "
               "after the first, of the slowest rank.")
    out.append("")
    out.append("| Case | Pair (arms) | Checks | Verdict | Final loss | Worst loss delta | Peak mem | Step time |")
    out.append("|---|---|---|---|---|---|---|---|")
    for case, p in sweep.rows:
        out.append("| " + " | ".join(_md(x) for x in (
            case.title, pair_title(p), checks_cell(p), case.entry_label(p.status),
            final_loss_cell(case, p),
            loss_delta_cell(case, p), peak_mem_cell(case, p), step_time_cell(case, p),
        )) + " |")
    return out


def _is_figure(contract: str) -> bool:
    """Whether a contract's check details are figures (``Judged.figures``: memory, pools, graph
    parity), listed in a section of their own."""
    judged = JUDGED.get(contract)
    return judged is not None and judged.figures


def _figures(sweep: SweepView, out: list[str]) -> None:
    """The checks of the graph and memory contracts that passed or failed, and step times."""
    figures = [(c, p) for c, p in sweep.rows
               if _is_figure(p.contract) and p.status in ("pass", "fail")]
    if figures:
        out += ["", "## Graph and memory figures", ""]
        for case, p in figures:
            out.append(case.mark(f"### {case.title} / {pair_title(p)}"))
            out += [case.mark(f"- {_line(check_line(c))}") for c in p.checks
                    if c.applicable and not c.name.startswith(tuple(a + "." for a in p.arms))]
            times = [(name, case.arms[name].figures.median_step_time_s) for name in p.arms
                     if name in case.arms]
            if len(times) == 2 and all(t for _, t in times):
                (a, ta), (b, tb) = times
                what = "compute step time" if case.emulated else "step time"
                out.append(case.mark(f"- {what} (median): {a} {ta * 1e3:.1f} ms, {b} "
                                     f"{tb * 1e3:.1f} ms, {a} / {b} = {ta / tb:.3f}"))
            out.append("")


def _comparison_sections(sweep: SweepView, out: list[str]) -> None:
    """Each comparison's section of its own (``Comparison.summary``; the reference pairs'
    microbatch groupings), where a verdict entry has its check."""
    for comparison in comparisons():
        section = comparison.summary
        if section is None:
            continue
        lines = [(case, p, check) for case, p in sweep.rows if p.contract in comparison.judged
                 for check in p.checks if check.name == section.check]
        if lines:
            out += ["", f"## {section.title}", ""] if out[-1] != "" else [f"## {section.title}", ""]
            out += [section.intro, ""]
            out += [f"- {case.case_id} / {p.pair}: {_line(check_line(c))}" for case, p, c in lines]
            out.append("")


def _repro_lines(case: CaseView, p: PairVerdict) -> list[str]:
    """``- repro <arm>: `<line>` `` for each arm of the entry that has one (the line that re-runs
    the arm alone into a fresh folder: ``harness.launch.ranks.repro``)."""
    out = []
    for name in p.arms:
        arm = case.arms.get(name)
        if arm and arm.outcome and arm.outcome.repro:
            out.append(case.mark(f"- repro {name}: `{arm.outcome.repro}`"))
    return out


def _failures_and_errors(sweep: SweepView, out: list[str]) -> None:
    """Failed checks and errors, each with its arms' repro lines (parked cases left out)."""
    failures = [(c, p) for c, p in sweep.rows if p.status == "fail" and c.parked is None]
    errors = [(c, p) for c, p in sweep.rows if p.status == "error" and c.parked is None]
    if failures:
        out += ["## Failures", ""] if out[-1] == "" else ["", "## Failures", ""]
        for case, p in failures:
            out.append(f"### {case.title} / {p.pair}")
            out += [case.mark(f"- {_line(check_line(c))}") for c in p.failed_checks]
            if p.error:
                out.append(case.mark(f"- also: {_line(p.error)}"))
            out += _repro_lines(case, p)
            out.append("")
    if errors:
        out += ["## Errors", ""] if out[-1] == "" else ["", "## Errors", ""]
        for case, p in errors:
            out.append(f"### {case.title} / {p.pair}")
            out.append(case.mark(f"- {_line(p.error or 'error')}"))
            out += _repro_lines(case, p)
            out.append("")


def _parked(sweep: SweepView, out: list[str]) -> None:
    """Parked cases (``expect:``), not counted by the gate."""
    if sweep.parked:
        out += ["## Parked (not counted by the gate)", ""] if out[-1] == "" else [
            "", "## Parked (not counted by the gate)", ""]
        for case in sweep.parked:
            assert case.parked is not None
            out.append(f"### {case.case_id}: {case.parked.outcome}")
            out.append(f"- {_line(case.parked.line(case.case_id).strip())}")
            for p in case.verdict.pairs:
                if p.status in ("fail", "error"):
                    out.append(f"- {p.pair}: {p.status.upper()}: {_line(entry_why(case, p))}")
            out.append("")


def _skipped(sweep: SweepView, out: list[str]) -> None:
    """Skipped entries with the reason."""
    skipped = [(c, p) for c, p in sweep.rows if p.status == "skipped"]
    if skipped:
        out += ["## Skipped", ""] if out[-1] == "" else ["", "## Skipped", ""]
        out += [case.mark(f"- {case.title} / {p.pair}: {_line(p.error or 'skipped')}")
                for case, p in skipped]
