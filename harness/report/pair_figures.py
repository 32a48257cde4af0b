"""The page's figure of one verdict entry: loss, grad norm and (CUDA) peak allocated memory per
step, the entry's arms overlaid on the top row and their difference (candidate - reference) on
the row below. Cases of emulated ranks draw one line per (arm, emulated rank) and one
difference per rank (their figures are each rank's own).

Each series is drawn through ``render.series`` with the key ``<case>/<pair>/<metric>/<arm>``
(``/r<rank>`` for an emulated rank; ``<arm>`` is ``diff`` on the lower row), one marker per step
that has a finite value, so the page's reader and its test find and count them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from harness.compare import PairVerdict, step_series
from harness.spec.places import short_label

from .load import CaseView
from .render import figure_svg, new_figure, series

GIB = 1024 ** 3


@dataclass(frozen=True)
class Metric:
    field: str   # the StepRecord field
    title: str
    scale: float = 1.0


METRICS = (Metric("loss", "loss"), Metric("grad_norm", "grad norm"),
           Metric("max_allocated_bytes", "peak allocated (GiB)", 1 / GIB))


def series_key(case_id: str, pair: str, metric: str, arm: str, rank: Optional[int] = None) -> str:
    """The key (``render.series_id``) of one plotted series of the page."""
    return f"{case_id}/{pair}/{metric}/{arm}" + ("" if rank is None else f"/r{rank}")


def finite_series(case: CaseView, arm: str, field: str, rank: Optional[int],
                  scale: float = 1.0) -> dict[int, float]:
    """Step -> the arm's finite ``field`` (lowest rank with records, or ``rank``), scaled."""
    view = case.arms.get(arm)
    if view is None:
        return {}
    return {s: v * scale for s, v in sorted(step_series(view.steps, field, rank).items())
            if v is not None and math.isfinite(v)}


def _ranks(case: CaseView, arms: Sequence[str]) -> list[Optional[int]]:
    """The line groups: every emulated rank of the arms, or the lowest rank (None) of a real run."""
    if not case.emulated:
        return [None]
    return sorted({r for a in arms if a in case.arms for r in case.arms[a].steps})


def pair_figure(case: CaseView, pair: PairVerdict):  # type: ignore[no-untyped-def]
    """The entry's figure, or None when none of its arms recorded a plotted figure."""
    from matplotlib.ticker import MaxNLocator

    arms = [a for a in pair.arms if a in case.arms]
    ranks = _ranks(case, arms)
    data = {m: {(a, r): finite_series(case, a, m.field, r, m.scale) for a in arms for r in ranks}
            for m in METRICS}
    metrics = [m for m in METRICS if any(data[m].values())]
    if not metrics:
        return None
    two = len(arms) == 2
    labels = [a if r is None else f"{a}, {short_label(r, case.world)}" for a in arms for r in ranks]
    legend_rows = -(-len(labels) // 4)
    # Fixed margins in inches (no tight_layout: it draws the figure once more, the page's cost).
    width, height = 3.4 * len(metrics), (3.6 if two else 2.3) + 0.2 * legend_rows
    fig = new_figure(width, height)
    axes = fig.subplots(2 if two else 1, len(metrics), squeeze=False, sharex="col",
                        gridspec_kw={"height_ratios": [3, 2]} if two else None)
    fig.subplots_adjust(left=0.75 / width, right=1 - 0.15 / width, bottom=0.45 / height,
                        top=1 - (0.35 + 0.2 * legend_rows) / height, wspace=0.75 / 3.4 * 1.4,
                        hspace=0.3)
    styles = ("-", "--", ":", "-.")
    for col, m in enumerate(metrics):
        top = axes[0][col]
        for i, a in enumerate(arms):
            for j, r in enumerate(ranks):
                pts = data[m][(a, r)]
                if pts:
                    label = labels[i * len(ranks) + j]
                    series(top, list(pts), list(pts.values()), key=series_key(
                        case.case_id, pair.pair, m.field, a, r), color=f"C{i}",
                        linestyle=styles[j % len(styles)], markersize=4, linewidth=1.2,
                        label=label)
        # an emulated rank's loss and grad norm are its own local figures, not the model's
        local = case.emulated and m.field != "max_allocated_bytes"
        # y given: matplotlib then skips measuring the axes' decorations to place the title
        # (nothing sits above the axes here), a third of the figure's drawing time.
        top.set_title(f"local {m.title} (emulated ranks)" if local else m.title, fontsize="medium",
                      y=1.0)
        if two:
            low = axes[1][col]
            for j, r in enumerate(ranks):
                a, b = data[m][(arms[0], r)], data[m][(arms[1], r)]
                steps = [s for s in a if s in b]
                if steps:
                    series(low, steps, [a[s] - b[s] for s in steps], key=series_key(
                        case.case_id, pair.pair, m.field, "diff", r), color="0.3",
                        linestyle=styles[j % len(styles)], markersize=3, linewidth=1)
            low.axhline(0, color="0.6", linewidth=0.8)
            low.set_ylabel(f"{arms[0]} - {arms[1]}", fontsize="x-small")
        for row in axes:
            row[col].grid(True, alpha=0.3)
            row[col].tick_params(labelsize="x-small")
            row[col].xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
            row[col].yaxis.set_major_locator(MaxNLocator(nbins=4))
        axes[-1][col].set_xlabel("step", fontsize="x-small")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize="small", loc="upper center",
               ncol=min(len(names), 4) or 1, frameon=False)
    return fig


def entry_svg(case: CaseView, pair: PairVerdict) -> Optional[str]:
    """The entry's figure as inline SVG (ids salted with the case and pair), or None."""
    fig = pair_figure(case, pair)
    return None if fig is None else figure_svg(fig, salt=f"{case.case_id}/{pair.pair}")
