"""The history's dashboard: one self-contained HTML page (inline SVG and CSS, no script, no
network), so it opens from a CI artifact or a shared file system.

It holds the drift flags (``history check``'s verdicts over the window), the last sweeps (time,
host, platform, commit, status, links to each sweep's folder, ``index.html`` and ``summary.md``,
relative to the page where they can be) and a trend per case and platform (its arms' figures
over the sweeps, the plots of ``plot``). Elements carry ids and classes a test or a reader can
find: ``#drift`` rows ``tr.drift`` / ``tr.moved`` / ``tr.too-few``, ``#sweeps`` rows
``tr.sweep``, ``div.trend[data-case][data-platform]``.
"""

from __future__ import annotations

import html
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from harness.results import write_text_atomic

from .db import History
from .drift import DriftReport, check
from .plot import Panel, figure_svg, panels_figure
from .query import Point, SeriesKey, SweepRow, last_sweeps, series, sweep_count

DEFAULT_PAGE = Path("results") / "history.html"
# The figures a case's trend shows, in this order (those it has; at most TREND_PANELS).
TREND_METRICS = ("final_loss", "step_time_median_s", "peak_allocated_bytes", "device_used_bytes",
                 "graph_pool_bytes", "peak_reserved_bytes", "wall_s")
TREND_PANELS = 3

_CSS = """
body{font-family:sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:.2em .5em;font-size:.9em;text-align:left}
tr.drift td,tr.status-fail td{background:#fdd}
tr.moved td{background:#def}
tr.too-few td,tr.status-error td{background:#ffe9c6}
tr.status-pass td:nth-child(6){color:#070}
div.trend{display:inline-block;vertical-align:top;margin:.5em;border:1px solid #ddd;padding:.3em}
div.trend.flagged{border-color:#c00}
svg{max-width:100%;height:auto}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _href(target: Path, page_dir: Path) -> str:
    try:
        return Path(os.path.relpath(target, page_dir)).as_posix()
    except ValueError:  # another drive
        return target.as_uri()


def _sweep_rows(sweeps: list[SweepRow], page_dir: Path) -> Iterable[str]:
    for s in sweeps:
        folder = Path(s.path)
        links = [f'<a href="{_e(_href(folder, page_dir))}/">folder</a>']
        for name in ("index.html", "summary.md"):
            if (folder / name).is_file():
                links.append(f'<a href="{_e(_href(folder / name, page_dir))}">{name}</a>')
        commit = (s.commit[:12] + (" +local changes" if s.dirty else "")) if s.commit else "unknown"
        yield (f'<tr class="sweep status-{_e(s.status)}"><td>{_e(s.name)}</td><td>{_e(s.started)}'
               f'</td><td>{_e(s.host)}</td><td>{_e(s.platform)}</td><td>{_e(commit)}</td>'
               f'<td>{_e(s.status.upper())}</td><td>{s.cases}</td><td>{" ".join(links)}</td></tr>')


def _drift_rows(report: DriftReport) -> Iterable[str]:
    for j in report.judged:
        if j.verdict == "steady":
            continue
        size = "" if j.verdict == "too-few" else f"{j.change * 100:+.1f}%"
        moved = (f"{j.moved_at.sweep} ({j.moved_at.commit_label})" if j.moved_at else "")
        yield (f'<tr class="{j.verdict}"><td>{j.verdict.upper()}</td><td>{_e(j.key.case_id)}</td>'
               f'<td>{_e(j.key.subject)}</td><td>{_e(j.key.metric)}</td>'
               f'<td>{_e(j.key.platform)}</td><td>{size}</td><td>{len(j.points)}</td>'
               f'<td>{_e(moved)}</td></tr>')


def _trends(found: dict[SeriesKey, list[Point]], flagged: set[tuple[str, str]]) -> Iterable[str]:
    groups: dict[tuple[str, str], dict[str, list[tuple[str, tuple[Point, ...]]]]] = {}
    for key in sorted(found):
        if key.metric in TREND_METRICS:
            groups.setdefault((key.case_id, key.platform), {}).setdefault(key.metric, []).append(
                (key.subject, tuple(found[key])))
    for (case_id, platform), metrics in groups.items():
        panels = [Panel(m, tuple(metrics[m])) for m in TREND_METRICS if m in metrics]
        fig = panels_figure(panels[:TREND_PANELS], columns=TREND_PANELS, panel_in=(3.6, 2.4))
        mark = " flagged" if (case_id, platform) in flagged else ""
        points = max(len(p) for lines in metrics.values() for _, p in lines)
        yield (f'<div class="trend{mark}" data-case="{_e(case_id)}" data-platform="{_e(platform)}"'
               f' data-points="{points}"><h3>{_e(case_id)} [{_e(platform or "?")}]</h3>'
               f'{figure_svg(fig, salt=f"{case_id}-{platform}")}</div>')


def render_dashboard(history: History, *, last: int, window: int, max_drift: float,
                     page_dir: Path) -> str:
    with history.read() as conn:
        sweeps = last_sweeps(conn, last)
        total = sweep_count(conn)
        trend = series(conn, last=last)
        report = check(series(conn, last=window), window=window, max_drift=max_drift)
    flagged = {(j.key.case_id, j.key.platform) for j in report.drifted}
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    head = report.lines()[0]
    drift = list(_drift_rows(report))
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>dcp-harness history</title>", f"<style>{_CSS}</style></head><body>",
        "<h1>dcp-harness history</h1>",
        f'<p id="about">{total} sweep(s) in {_e(history.shown)}; generated {now}.</p>',
        f'<section id="drift"><h2>Drift</h2><p class="headline">{_e(head)}</p>',
        ("<table><tr><th>verdict</th><th>case</th><th>arm</th><th>figure</th><th>platform</th>"
         "<th>change</th><th>points</th><th>moved first at</th></tr>" + "".join(drift)
         + "</table>") if drift else "<p>No figure drifted.</p>",
        "</section>",
        f'<section id="sweeps"><h2>Last {len(sweeps)} sweeps</h2><table><tr><th>sweep</th>'
        "<th>started (UTC)</th><th>host</th><th>platform</th><th>commit</th><th>status</th>"
        "<th>cases</th><th>links</th></tr>",
        *_sweep_rows(sweeps, page_dir), "</table></section>",
        '<section id="trends"><h2>Trends per case and platform</h2>',
        *_trends(trend, flagged), "</section>", "</body></html>", ""])


def write_dashboard(history: History, path: Path, *, last: int = 30, window: int = 10,
                    max_drift: float = 0.05) -> Path:
    """Write the dashboard page to ``path``, atomically; the path."""
    path = Path(path)
    page = render_dashboard(history, last=last, window=window, max_drift=max_drift,
                            page_dir=path.resolve().parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, page)
    return path
