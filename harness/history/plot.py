"""The history's plots through the reports' one plotting path (``harness.report.render``): a
Figure of panels, each panel one or more series over sweeps, written as a PNG file (``history
show``) or as inline SVG (the dashboard). Each series is ``render.series`` (findable in the SVG as
``series-<panel>-<label>``, one marker per point). The x axis names each point by sweep and short
commit; the y axis never shows an offset (``1e-8+5.19``): its ticks are the values. A panel of a
judged figure draws its bound as a band around the level and marks the sweep it moved at."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from harness.report.render import figure_png, figure_svg, new_figure, series

from .query import Point, SeriesKey

MAX_PANELS = 12
COLUMNS = 3

__all__ = ["MAX_PANELS", "Panel", "figure_png", "figure_svg", "panels_figure", "write_series_png"]


@dataclass(frozen=True)
class Panel:
    title: str
    lines: tuple[tuple[str, tuple[Point, ...]], ...]  # (legend label, points oldest first)
    band: Optional[tuple[float, float]] = None  # (low, high): the level +- the bound
    moved_at: Optional[int] = None  # index (in the longest line) of the sweep it moved at


def _tick_label(p: Point) -> str:
    sweep = p.sweep if len(p.sweep) <= 16 else p.sweep[:7] + ".." + p.sweep[-7:]
    return f"{sweep}\n{p.commit[:7] if p.commit else '?'}"


def panels_figure(panels: Sequence[Panel], columns: int = COLUMNS,  # type: ignore[no-untyped-def]
                  panel_in: tuple[float, float] = (5.0, 3.0)):
    """One Figure of ``panels`` (x: the sweeps in order, labelled by sweep and short commit)."""
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
        if panel.band is not None:
            ax.axhspan(*panel.band, color="#2a7", alpha=0.15, lw=0, label="bound")
        if panel.moved_at is not None:
            ax.axvline(panel.moved_at, color="#c00", lw=1, ls="--", label="moved at")
        ax.set_title(panel.title, fontsize=8)
        ticks = list(range(0, len(longest), max(1, -(-len(longest) // 5))))
        ax.set_xticks(ticks, [_tick_label(longest[i]) for i in ticks], fontsize=6)
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        ax.tick_params(axis="y", labelsize=7)
        if len(panel.lines) > 1 or panel.band is not None or panel.moved_at is not None:
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
