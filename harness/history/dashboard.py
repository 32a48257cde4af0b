"""The history's dashboard: one self-contained HTML page (inline SVG and CSS, no script, no
network), so it opens from a CI artifact or a shared file system.

It opens with the verdict (``#verdict``, coloured: pass green, fail red, nothing judged amber),
then the drift flags of the followed label (``history check``'s verdicts over the window, drifts
first, each with its plot: the bound a band, the sweep it moved at marked; one line counts the
steady and too-few figures), the last sweeps of that label (time, host, platform, commit,
status, links to each sweep's folder, ``index.html`` and ``summary.md``, relative to the page
where they can be), the sweeps of the other labels apart, and a trend per case and platform (its
arms' figures over the sweeps, the plots of ``plot``). Elements carry ids and classes a test or a
reader can find: ``#drift`` rows ``tr.drift`` / ``tr.moved`` (and their plots ``div.flag``),
``#sweeps`` rows ``tr.sweep``, ``#others``, ``div.trend[data-case][data-platform]``.
"""

from __future__ import annotations

import html
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Optional

from harness.results import write_text_atomic

from .db import History
from .drift import DriftReport, Judged, check, is_judged
from .labels import followed
from .plot import Panel, figure_svg, panels_figure
from .query import Point, SeriesKey, SweepRow, labels, last_sweeps, series, sweep_count

DEFAULT_PAGE = Path("results") / "history.html"
# The figures a case's trend shows, in this order (those it has, of the step times the one judged
# on the platform; at most TREND_PANELS).
TREND_METRICS = ("final_loss", "step_time_median_s", "step_cpu_median_s", "peak_allocated_bytes",
                 "device_used_bytes", "graph_pool_bytes", "peak_reserved_bytes", "wall_s")
TREND_PANELS = 3

_CSS = """
body{font-family:sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:.2em .5em;font-size:.9em;text-align:left}
tr.drift td,tr.status-fail td{background:#fdd}
tr.moved td{background:#def}
tr.too-few td,tr.status-error td{background:#ffe9c6}
tr.status-pass td:nth-child(6){color:#070}
#verdict{font-size:1.3em;font-weight:bold;padding:.4em .8em;border-radius:4px;color:#fff}
#verdict.pass{background:#1a7f37}
#verdict.fail{background:#c62828}
#verdict.error{background:#b26a00}
div.flag{margin:.3em 0 1em 0}
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


def _flag_plot(j: Judged) -> str:
    """The plot of a flagged figure: its points, the bound as a band, the moved-at sweep."""
    pts = j.points
    band = ((j.level - j.bound, j.level + j.bound)
            if j.level is not None and j.bound is not None else None)
    moved = pts.index(j.moved_at) if j.moved_at is not None else None
    fig = panels_figure([Panel(j.key.label, ((j.key.subject, pts),), band, moved)], columns=1,
                        panel_in=(6.0, 2.6))
    return figure_svg(fig, salt=f"flag-{j.key.label}")


def _drift_rows(report: DriftReport) -> Iterable[str]:
    """The drifts, then the moves the better way: a row each, its plot under it."""
    for j in sorted(report.judged, key=lambda j: ({"drift": 0, "moved": 1}.get(j.verdict, 2), j.key)):
        if j.verdict not in ("drift", "moved"):
            continue
        size = f"{j.change * 100:+.1f}%"
        moved = (f"{j.moved_at.sweep} ({j.moved_at.commit_label})" if j.moved_at else "")
        bound = f"{j.bound / abs(j.level) * 100:.1f}%" if j.level and j.bound is not None else ""
        yield (f'<tr class="{j.verdict}"><td>{j.verdict.upper()}</td><td>{_e(j.key.case_id)}</td>'
               f'<td>{_e(j.key.subject)}</td><td>{_e(j.key.metric)}</td>'
               f'<td>{_e(j.key.platform)}</td><td>{size}</td><td>{bound}</td>'
               f'<td>{len(j.points)}</td><td>{_e(moved)}</td></tr>'
               f'<tr class="plot"><td colspan="9"><div class="flag">{_flag_plot(j)}</div></td></tr>')


def _others(others: tuple[tuple[str, int], ...], rows: list[SweepRow], page_dir: Path) -> str:
    if not others:
        return ""
    listed = ", ".join(f"{_e(name)} ({n})" for name, n in others)
    return ('<section id="others"><h2>Other labels (not in the trends above)</h2>'
            f"<p>{listed}: judge one with <code>dcp-harness history check --label L</code>.</p>"
            "<table><tr><th>sweep</th><th>started (UTC)</th><th>host</th><th>platform</th>"
            "<th>commit</th><th>status</th><th>cases</th><th>links</th><th>label</th></tr>"
            + "".join(r.replace("</tr>", f"<td>{_e(s.label)}</td></tr>")
                      for r, s in zip(_sweep_rows(rows, page_dir), rows))
            + "</table></section>")


def _trends(found: dict[SeriesKey, list[Point]], flagged: set[tuple[str, str]]) -> Iterable[str]:
    groups: dict[tuple[str, str], dict[str, list[tuple[str, tuple[Point, ...]]]]] = {}
    for key in sorted(found):  # the step time judged on the platform (the other is shown only)
        if key.metric in TREND_METRICS and (key.metric == "wall_s" or is_judged(key)):
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


def render_dashboard(history: History, *, last: int, window: int, max_drift: Optional[float],
                     page_dir: Path, label: Optional[str] = None) -> str:
    with history.read() as conn:
        counts = labels(conn)
        label = followed(label, counts)
        every = last_sweeps(conn, max(last, 1) * (len(counts) or 1))
        total = sweep_count(conn)
        trend = series(conn, last=last, label=label)
        others = tuple((name, n) for name, n in counts.items() if name != label)
        report = check(series(conn, last=window, label=label), window=window,
                       max_drift=max_drift, label=label, others=others)
    sweeps = [s for s in every if s.label == label][:last]
    apart = [s for s in every if s.label != label][:last]
    flagged = {(j.key.case_id, j.key.platform) for j in report.drifted}
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    lines = report.lines()
    verdict = {0: "pass", 1: "fail", 2: "error"}[report.exit_code]
    drift = list(_drift_rows(report))
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>dcp-harness history</title>", f"<style>{_CSS}</style></head><body>",
        f'<p id="verdict" class="{verdict}">{_e(lines[0])}</p>',
        "<h1>dcp-harness history</h1>",
        f'<p id="about">{total} sweep(s) in {_e(history.shown)}, following label '
        f'<b>{_e(label)}</b>; generated {now}.</p>',
        '<section id="drift"><h2>Drift</h2>',
        ("<table><tr><th>verdict</th><th>case</th><th>arm</th><th>figure</th><th>platform</th>"
         "<th>change</th><th>bound</th><th>points</th><th>moved first at</th></tr>"
         + "".join(drift) + "</table>") if drift else "<p>No figure drifted.</p>",
        f'<p class="counts">{_e(lines[-2] if others else lines[-1])}</p>',
        "</section>",
        f'<section id="sweeps"><h2>Last {len(sweeps)} sweeps labelled {_e(label)}</h2><table>'
        "<tr><th>sweep</th><th>started (UTC)</th><th>host</th><th>platform</th><th>commit</th>"
        "<th>status</th><th>cases</th><th>links</th></tr>",
        *_sweep_rows(sweeps, page_dir), "</table></section>",
        _others(others, apart, page_dir),
        '<section id="trends"><h2>Trends per case and platform</h2>',
        *_trends(trend, flagged), "</section>", "</body></html>", ""])


def write_dashboard(history: History, path: Path, *, last: int = 30, window: int = 10,
                    max_drift: Optional[float] = None, label: Optional[str] = None) -> Path:
    """Write the dashboard page to ``path``, atomically; the path."""
    path = Path(path)
    page = render_dashboard(history, last=last, window=window, max_drift=max_drift,
                            page_dir=path.resolve().parent, label=label)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, page)
    return path
