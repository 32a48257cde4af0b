"""The history's plots through the reports' one plotting path (``harness.report.render``): a
Figure of panels, each panel one or more series over sweeps, written as a PNG file (``history
show``) or as inline SVG (the dashboard). Each series is ``render.series`` (findable in the SVG as
``series-<panel>-<label>``, one marker per point)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from harness.report.render import figure_png, figure_svg, new_figure, series

from .query import Point, SeriesKey

MAX_PANELS = 12
COLUMNS = 3

__all__ = ["MAX_PANELS", "Panel", "figure_png", "figure_svg", "panels_figure", "write_series_png"]


@dataclass(frozen=True)
class Panel:
    title: str
    lines: tuple[tuple[str, tuple[Point, ...]], ...]  # (legend label, points oldest first)


def panels_figure(panels: Sequence[Panel], columns: int = COLUMNS,  # type: ignore[no-untyped-def]
                  panel_in: tuple[float, float] = (5.0, 3.0)):
    """One Figure of ``panels`` (x: the sweeps in order, labelled by date)."""
    columns = max(1, min(columns, len(panels)))
    rows = max(1, -(-len(panels) // columns))
    fig = new_figure(panel_in[0] * columns, panel_in[1] * rows, dpi=90)
    for n, panel in enumerate(panels, 1):
        ax = fig.add_subplot(rows, columns, n)
        longest: tuple[Point, ...] = ()
        for label, pts in panel.lines:
            series(ax, range(len(pts)), [p.value for p in pts], key=f"{panel.title}-{label}",
                   marker="o", markersize=3, label=label)
            longest = pts if len(pts) > len(longest) else longest
        ax.set_title(panel.title, fontsize=8)
        ticks = list(range(0, len(longest), max(1, len(longest) // 4)))
        ax.set_xticks(ticks, [longest[i].started[:10] for i in ticks], fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        if len(panel.lines) > 1:
            ax.legend(fontsize=6)
    if not panels:
        fig.text(0.5, 0.5, "no series", ha="center")
    fig.tight_layout()
    return fig


def write_series_png(found: dict[SeriesKey, list[Point]], path: Path) -> tuple[Path, int]:
    """``history show``'s plot: one panel per series (the first :data:`MAX_PANELS`, sorted);
    (path, how many series were left out)."""
    keys = sorted(found)[:MAX_PANELS]
    panels = [Panel(k.label, ((k.subject, tuple(found[k])),)) for k in keys]
    return figure_png(panels_figure(panels), path), max(0, len(found) - len(keys))
