"""The emulated-rank figures of a sweep: the table of TE #3353's own validation beside ours.

For every case of emulated ranks (``emulate.ranks``: each rank alone on one device, its
communication on the loopback layer), one column per emulated rank, from the case folder alone
(step records, the allocation-site tables ``<arm>/sites.rank<r>.json``, the verdict's pairs):

* the capture line, graph vs eager bitwise steps (loss, aux loss, grad norm of the rank's own
  records: the ``graph_vs_eager`` verdict's figure of the rank), NaN / skipped steps, the CP sizes replayed and the forward replays per (CP size,
  physical slot) frame over the graphed steps, graph pool and arena MiB (the pair whose
  comparison gives the ``graphed`` figures: ``Comparison.emulated_figures``);
* slot-shared pool / largest single variant and separate pools / largest (``pools``);
* DCP+graph vs fixed-CP+graph after ``empty_cache()`` at the memory probe: whole-device delta in
  MiB and % of the device, the used MiB of both, active and reserved deltas (``memory``);
* compute step time (median over the graphed steps; nothing is communicated) and peak allocated
  (``graphed``);
* then per rank the live bytes by pool and the allocator snapshot diff, DCP+graph minus
  fixed-CP+graph, largest first (the reserved delta explained; ``memory``).

:func:`emulated_sections` is summary.md's section; :func:`emulated_tables` the same text for a
sweep folder (``bench/emulated.py`` prints it). A leaf: no torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from harness.compare import (EmulatedFigures, PairVerdict, bitwise_figure, comparison_of,
                             frame_replays, frames_text)
from harness.results import GraphStats, MemoryProbe, StepRecord
from harness.sites import SiteTable, diff_sites, pool_totals
from harness.spec.places import short_label

from .load import ArmView, CaseView, SweepView

MIB = 2.0 ** 20
TOP_SITES = 8

# TE PR #3353's own validation run, as its description on GitHub reports it (8 GB200s, real ranks).
TE3353 = {
    "layout": "8 GB200 (2 nodes), real ranks; 48 layers, 128 experts, PP4 VPP4 EP2, DCP {1,2}, "
              "seq 8192, GBS 64",
    "capture": "2 dynamic-CP variants over 8 slot-aliased physical TE pool slots",
    "losses": "16 steps, no NaN / skipped; LM loss within 0.00398 abs (0.0351 %)",
    "nan": "none",
    "replayed": "CP1 and CP2",
    "device_delta": "-440..+16 and -366..+96 MiB (two 3-step runs)",
    "device_delta_pct": "largest +0.1001 %",
    "active_delta": "+80..+272 MiB",
    "reserved_delta": "+758..+1296 MiB (left for follow-up profiling)",
    "pool_ratio": "not reported ('no multiplicative growth with two CP variants')",
}


@dataclass(frozen=True)
class RankFigures:
    """One emulated rank's figures (None / empty where its case or records lack them)."""

    rank: int
    label: str
    capture: Optional[str] = None
    # graph vs eager: the verdict's figure of the rank (steps bitwise equal of those compared)
    bitwise: Optional[str] = None
    nan_or_skipped: dict[str, list[int]] = field(default_factory=dict)
    replayed_cp: tuple[int, ...] = ()
    graphed_steps: int = 0
    frames: dict[tuple[int, int], int] = field(default_factory=dict)
    pool_mib: Optional[float] = None
    arena_mib: Optional[float] = None
    shared_over_largest: Optional[float] = None
    separate_over_largest: Optional[float] = None
    device_used_mib: Optional[tuple[float, float]] = None  # (DCP+graph, fixed-CP+graph)
    device_delta_mib: Optional[float] = None
    device_delta_pct: Optional[float] = None
    active_delta_mib: Optional[float] = None
    reserved_delta_mib: Optional[float] = None
    step_s: Optional[tuple[Optional[float], Optional[float]]] = None  # (graph, eager)
    peak_allocated_mib: Optional[float] = None
    by_pool: dict[str, tuple[float, float]] = field(default_factory=dict)
    site_diff: tuple[Any, ...] = ()


def _gives(pair: PairVerdict, figures: EmulatedFigures) -> bool:
    comparison = comparison_of(pair.contract)
    return comparison is not None and comparison.emulated_figures == figures


def _pair_of(case: CaseView, figures: EmulatedFigures) -> Optional[PairVerdict]:
    """The case's first two-arm pair whose comparison gives ``figures``."""
    return next((p for p in case.verdict.pairs if _gives(p, figures) and len(p.arms) == 2), None)


def _arms_of(case: CaseView, figures: EmulatedFigures) -> Optional[tuple[ArmView, ArmView]]:
    """The two arms of the case's first pair whose comparison gives ``figures``."""
    pair = _pair_of(case, figures)
    if pair is None or not all(a in case.arms for a in pair.arms):
        return None
    return case.arms[pair.arms[0]], case.arms[pair.arms[1]]


def _figure(pair: Optional[PairVerdict], name: str) -> Optional[str]:
    """The detail of the figure ``name`` of a verdict entry (None: it has none)."""
    return next((c.detail for c in (pair.checks if pair is not None else ()) if c.name == name),
                None)


def _records(arm: Optional[ArmView], rank: int) -> list[StepRecord]:
    return list(arm.steps.get(rank, ())) if arm is not None else []


def _last_stats(records: Sequence[StepRecord]) -> Optional[GraphStats]:
    found = [r.graph_stats for r in records if r.graph_stats is not None]
    return found[-1] if found else None


def _last_probe(records: Sequence[StepRecord]) -> Optional[MemoryProbe]:
    found = [r.memory_probe for r in records if r.memory_probe is not None]
    return found[-1] if found else None


def _median(values: Sequence[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def rank_figures(case: CaseView, rank: int) -> RankFigures:
    """The figures of emulated ``rank`` of ``case`` (see the module doc)."""
    label = next((x for x in case.labels if x.startswith(short_label(rank, case.world) + " ")),
                 short_label(rank, case.world))
    out: dict[str, Any] = {"rank": rank, "label": label}
    out["nan_or_skipped"] = {name: [r.step for r in _records(arm, rank) if r.nan or r.skipped]
                             for name, arm in case.arms.items()}
    out["nan_or_skipped"] = {k: v for k, v in out["nan_or_skipped"].items() if v}
    out["bitwise"] = _figure(_pair_of(case, "graphed"), bitwise_figure(rank))
    ge = _arms_of(case, "graphed")
    if ge is not None:
        g, e = _records(ge[0], rank), _records(ge[1], rank)
        frames = frame_replays({rank: g}).get(rank, {})
        out["frames"] = frames
        out["replayed_cp"] = tuple(sorted({c for c, _ in frames}))
        out["graphed_steps"] = sum(1 for r in g if r.graphed)
        stats = _last_stats(g)
        if stats is not None:
            out["capture"] = stats.summary
            out["pool_mib"] = stats.pool_reserved_bytes / MIB
            out["arena_mib"] = stats.arena_bytes / MIB
        out["step_s"] = (_median([r.step_time_s for r in g if r.graphed]),
                         _median([r.step_time_s for r in e[1:]]))
        peaks = [r.max_allocated_bytes for r in g + e]
        peaks = [p for p in peaks if p is not None]
        out["peak_allocated_mib"] = max(peaks) / MIB if peaks else None
    gp = _arms_of(case, "pools")
    if gp is not None:
        shared, sep = _last_stats(_records(gp[0], rank)), _last_stats(_records(gp[1], rank))
        largest = sep.largest_pool_bytes if sep is not None else None
        if shared is not None and sep is not None and largest:
            out["shared_over_largest"] = shared.pool_reserved_bytes / largest
            out["separate_over_largest"] = sep.pool_reserved_bytes / largest
    dv = _arms_of(case, "memory")
    if dv is not None:
        out.update(_memory(dv, rank))
    return RankFigures(**out)


def _memory(arms: tuple[ArmView, ArmView], rank: int) -> dict[str, Any]:
    """The DCP vs fixed-CP memory figures of ``rank`` (probes, then the site tables)."""
    out: dict[str, Any] = {}
    a, b = (_last_probe(_records(arm, rank)) for arm in arms)
    if a is not None and b is not None:
        out["device_used_mib"] = (a.device_used_bytes / MIB, b.device_used_bytes / MIB)
        out["device_delta_mib"] = (a.device_used_bytes - b.device_used_bytes) / MIB
        out["device_delta_pct"] = (100.0 * (a.device_used_bytes - b.device_used_bytes)
                                   / b.device_total_bytes)
        out["active_delta_mib"] = (a.active_bytes - b.active_bytes) / MIB
        out["reserved_delta_mib"] = (a.reserved_bytes - b.reserved_bytes) / MIB
    sa, sb = arms[0].sites.get(rank), arms[1].sites.get(rank)
    if isinstance(sa, SiteTable) and isinstance(sb, SiteTable):
        ta, tb = pool_totals(sa.sites), pool_totals(sb.sites)
        out["by_pool"] = {f"{p} {st}": (ta.get((p, st), 0) / MIB, tb.get((p, st), 0) / MIB)
                          for p, st in sorted(set(ta) | set(tb))}
        out["site_diff"] = diff_sites(sa.sites, sb.sites, top=TOP_SITES)
    return out


def _f(value: Optional[float], fmt: str = "{:+.0f}") -> str:
    return "-" if value is None else fmt.format(value)


Row = tuple[str, str, Callable[[RankFigures], str]]


def _rows(fixed: str) -> list[Row]:
    def nan(f: RankFigures) -> str:
        return "none" if not f.nan_or_skipped else "; ".join(
            f"{arm} steps {steps}" for arm, steps in f.nan_or_skipped.items())

    def bitwise(f: RankFigures) -> str:
        return f.bitwise or "-"

    def used(f: RankFigures) -> str:
        return " / ".join(f"{v:.0f}" for v in f.device_used_mib) if f.device_used_mib else "-"

    def step(f: RankFigures) -> str:
        return "-" if f.step_s is None else (f"{_f(f.step_s[0], '{:.3f}')} / "
                                             f"{_f(f.step_s[1], '{:.3f}')}")

    return [
        ("capture line", TE3353["capture"], lambda f: f.capture or "-"),
        ("graph vs eager (loss, aux loss, grad norm)", TE3353["losses"], bitwise),
        ("NaN / skipped steps", TE3353["nan"], nan),
        ("CP sizes replayed (graphed steps)", TE3353["replayed"],
         lambda f: f"{list(f.replayed_cp)} over {f.graphed_steps} steps" if f.graphed_steps else "-"),
        ("forward replays per (CP, slot)", "-", lambda f: frames_text(f.frames) if f.frames else "-"),
        ("graph pool / arenas MiB", "-",
         lambda f: f"{_f(f.pool_mib, '{:.0f}')} / {_f(f.arena_mib, '{:.0f}')}"),
        ("slot-shared pool / largest variant", TE3353["pool_ratio"],
         lambda f: _f(f.shared_over_largest, "{:.4f}")),
        ("separate pools / largest", "-", lambda f: _f(f.separate_over_largest, "{:.4f}")),
        (f"whole device, DCP+graph vs {fixed} (MiB)", TE3353["device_delta"],
         lambda f: _f(f.device_delta_mib)),
        ("whole device delta, % of device", TE3353["device_delta_pct"],
         lambda f: _f(f.device_delta_pct, "{:+.4f} %")),
        (f"whole device used MiB (DCP+graph / {fixed})", "-", used),
        ("active delta (MiB)", TE3353["active_delta"], lambda f: _f(f.active_delta_mib)),
        ("reserved delta (MiB)", TE3353["reserved_delta"], lambda f: _f(f.reserved_delta_mib)),
        ("compute step s (graph / eager, median)", "-", step),
        ("peak allocated MiB", "-", lambda f: _f(f.peak_allocated_mib, "{:.0f}")),
    ]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _not_run(case: CaseView) -> Optional[str]:
    """Why no arm of the case ran here (every outcome ``skipped``), or None."""
    outcomes = [a.outcome for a in case.arms.values()]
    if outcomes and all(o is not None and o.status == "skipped" for o in outcomes):
        return "; ".join(dict.fromkeys(o.detail for o in outcomes if o is not None))
    return None


def case_table(case: CaseView) -> list[str]:
    """Markdown lines: the table of one case of emulated ranks and each rank's snapshot diff."""
    why = _not_run(case)
    if why is not None:
        return [f"### {case.title}", "", case.mark(f"Not run here: {why}")]
    figs = [rank_figures(case, r) for r in case.emulated_ranks]
    dv = _arms_of(case, "memory")
    fixed = dv[1].name if dv is not None else "fixed CP"
    head = ["figure", f"TE #3353 ({TE3353['layout']})"] + [f.label for f in figs]
    lines = [f"### {case.title}", "",
             case.mark("Every figure of an emulated rank is that rank alone on one device, its "
                       "communication on the loopback layer; losses are its own local figures."),
             "", "| " + " | ".join(_cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    left_out = []
    for name, te, cell in _rows(fixed):
        cells = [cell(f) for f in figs]
        if all(c in ("-", "- / -") for c in cells):  # e.g. graph figures of an eager CPU case
            left_out.append(name)
            continue
        lines.append("| " + " | ".join(_cell(x) for x in [name, te] + cells) + " |")
    if left_out:
        lines += ["", case.mark(f"No figure for any rank (its arms or device do not record it): "
                                f"{'; '.join(left_out)}.")]
    for f in figs:
        if f.by_pool:
            lines += ["", f"{f.label}: live bytes at the memory probe by pool (MiB, DCP+graph / "
                          f"{fixed}): " + ", ".join(f"{k} {a:.0f} / {b:.0f}"
                                                    for k, (a, b) in f.by_pool.items())]
        if f.site_diff:
            lines += ["", f"{f.label}: allocator snapshot diff, DCP+graph minus {fixed} "
                          f"(top {len(f.site_diff)}, largest change first)", "",
                      f"| {f.label}: pool | state | site | DCP+graph MiB | {fixed} MiB | delta MiB |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {short_label(f.rank, case.world)}: {d.pool} | {d.state} | "
                      f"`{_cell(d.site)}` | {d.candidate / MIB:.1f} | {d.reference / MIB:.1f} | "
                      f"{d.delta / MIB:+.1f} |" for d in f.site_diff]
    return lines


def emulated_sections(sweep: SweepView) -> list[str]:
    """summary.md's "Emulated ranks" section (empty without a case of emulated ranks)."""
    cases = [c for c in sweep.cases if c.emulated]
    if not cases:
        return []
    out = ["", "## Emulated ranks: TE #3353's validation beside ours", ""]
    for case in cases:
        out += case_table(case) + [""]
    return out[:-1]


def emulated_tables(sweep: SweepView) -> str:
    """The emulated-rank tables of a sweep as markdown ("" without a case of emulated ranks)."""
    return "\n".join(emulated_sections(sweep)).strip("\n")
