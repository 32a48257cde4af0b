"""The history's plots, one path for both outputs: a matplotlib Figure of panels, each panel
one or more series over sweeps, written as a PNG file (``history show``) or as inline SVG text
(the dashboard: text kept as text, no date, ids salted per figure so several share one page).
Each plotted series carries the SVG id ``series-<n>`` with one marker per point."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from harness.results import write_bytes_atomic

from .query import Point, SeriesKey

MAX_PANELS = 12
COLUMNS = 3
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]+")


@dataclass(frozen=True)
class Panel:
    title: str
    lines: tuple[tuple[str, tuple[Point, ...]], ...]  # (legend label, points oldest first)


def new_figure(width_in: float, height_in: float, dpi: int = 90):  # type: ignore[no-untyped-def]
    """A Figure on its own Agg canvas (no global backend switched)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def series_id(label: str) -> str:
    return "series-" + _UNSAFE.sub("_", label)


def panels_figure(panels: Sequence[Panel], columns: int = COLUMNS, panel_in=(5.0, 3.0)):  # type: ignore[no-untyped-def]
    """One Figure of ``panels`` (x: the sweeps in order, labelled by date)."""
    columns = max(1, min(columns, len(panels)))
    rows = max(1, -(-len(panels) // columns))
    fig = new_figure(panel_in[0] * columns, panel_in[1] * rows)
    for n, panel in enumerate(panels, 1):
        ax = fig.add_subplot(rows, columns, n)
        longest: tuple[Point, ...] = ()
        for label, pts in panel.lines:
            (line,) = ax.plot(range(len(pts)), [p.value for p in pts], marker="o", markersize=3,
                              label=label)
            line.set_gid(series_id(f"{panel.title}-{label}"))
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


def figure_png(fig, path: Path) -> Path:  # type: ignore[no-untyped-def]
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    write_bytes_atomic(path, buf.getvalue())
    return path


def figure_svg(fig, salt: str) -> str:  # type: ignore[no-untyped-def]
    """``fig`` as an ``<svg>`` element to put inline in HTML."""
    from matplotlib import rc_context

    buf = io.StringIO()
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    return text[text.index("<svg"):].strip()


def write_series_png(series: dict[SeriesKey, list[Point]], path: Path) -> tuple[Path, int]:
    """``history show``'s plot: one panel per series (the first :data:`MAX_PANELS`, sorted);
    (path, how many series were left out)."""
    keys = sorted(series)[:MAX_PANELS]
    panels = [Panel(k.label, ((k.subject, tuple(series[k])),)) for k in keys]
    return figure_png(panels_figure(panels), path), max(0, len(series) - len(keys))
