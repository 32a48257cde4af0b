"""index.html: one self-contained page to triage a sweep (no network, no external CSS or JS).

The gate line and its per-entry lines, one table row per case and per verdict entry with its
status, the failing checks with value, bound and step, errors with the arms' repro lines, skip
reasons grouped by kind, parked cases; then per case its arms (outcome, relative links to the
log and outcome, repro line), per entry every check and the curves (``pair_figures``, inline
SVG through ``render.figure_svg``), and per arm and rank its figures. Everything comes from the
``SweepView`` (``load_sweep``: nothing is judged here) and the gate's own message.
"""

from __future__ import annotations

import base64
import gzip
import base64
import gzip
import html
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Callable, Collection, Iterable, Optional, Sequence

from harness.compare import SKIP_KINDS, Check, PairVerdict
from harness.compare.series import memory_probes
from harness.results import (CASE_FILE, INDEX_FILE, JUNIT_FILE, OUTCOME_FILE, SUMMARY_FILE,
                             VERDICT_FILE)

from harness.caseplan import PLAN_FILE

from .gate import gate_result
from .load import ArmView, CaseView, SweepView, arm_figures
from .text import (
    DASH,
    arm_causes,
    checks_cell,
    entry_why,
    final_loss_cell,
    fmt_gib,
    fmt_num,
    fmt_s,
    pair_title,
    peak_mem_cell,
    step_time_cell,
)

PAGE_FILE = "index.html"
_STEP = re.compile(r"\bstep (\d+)\b")
_ANCHOR = re.compile(r"[^A-Za-z0-9_.-]+")

# A figure renderer: (case, entry) -> inline <svg> text, or None when there is nothing to draw.
FigureFn = Callable[[CaseView, PairVerdict], Optional[str]]

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 24px 40px;color:#1d1d1f}
h1{font-size:22px;margin:18px 0 6px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:16px 0 6px}table{border-collapse:collapse;margin:6px 0 10px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f6;position:sticky;top:0}td.num{text-align:right;font-variant-numeric:tabular-nums}
code,pre{font:12px ui-monospace,Menlo,Consolas,monospace}pre{background:#f6f6f8;padding:8px;
overflow-x:auto;white-space:pre-wrap}.badge{display:inline-block;padding:0 7px;border-radius:9px;
font-weight:600;font-size:12px;color:#fff}.b-pass{background:#1a7f37}.b-fail{background:#cf222e}
.b-error{background:#bc4c00}.b-skipped{background:#6e7781}tr.fail td{background:#ffebe9}
tr.error td{background:#fff1e5}tr.skipped td{color:#57606a}tr.case td{background:#f4f4f6;
font-weight:600}tr.check.failed td{background:#ffebe9;font-weight:600}.gate{font-size:16px;
font-weight:600;padding:8px 12px;border-radius:6px}.gate.pass{background:#dafbe1}
.gate.fail{background:#ffebe9}.gate.error,.gate.skipped{background:#fff1e5}
.note{color:#57606a}.figure svg{max-width:100%;height:auto}section.case{margin-top:26px}
nav a{margin-right:12px}td.pair{padding-left:22px}details>summary{cursor:pointer}
section.case{content-visibility:auto;contain-intrinsic-size:auto 1200px}
details.lazy{margin:4px 0}details.lazy>summary{font-weight:600}
"""

# The collapsed cases of a large sweep: each one's section, kept as text in the page's own JSON
# (``#lazy-cases``: gzip, base64; the browser's DecompressionStream opens it once, when first
# needed), is put in when its <details> opens, or when a link (``#case-...``) names it or one of
# its entries. No network: the page holds everything.
LAZY_SCRIPT = """(function () {
const lazy = Array.from(document.querySelectorAll('details.lazy'));
let data = null;
function cases() {
  if (!data) {
    const text = atob(document.getElementById('lazy-cases').textContent.trim());
    const bytes = Uint8Array.from(text, c => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    data = new Response(stream).text().then(JSON.parse);
  }
  return data;
}
async function fill(d) {
  if (d.dataset.filled) return;
  d.dataset.filled = '1';
  d.insertAdjacentHTML('beforeend', (await cases())[d.dataset.case]);
}
lazy.forEach(d => d.addEventListener('toggle', () => { if (d.open) fill(d); }));
async function reveal() {
  const id = decodeURIComponent(location.hash.slice(1));
  const d = id && lazy.find(x => id === x.id || id.startsWith(x.id + '--'));
  if (!d) return;
  d.open = true;
  await fill(d);
  (document.getElementById(id) || d).scrollIntoView();
}
window.addEventListener('hashchange', reveal);
reveal();
})();"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def anchor(*parts: str) -> str:
    """An element id for a case (and pair): ``case-<id>`` / ``case-<id>--<pair>``."""
    first, *rest = parts
    return "--".join(["case-" + _ANCHOR.sub("_", first), *(_ANCHOR.sub("_", p) for p in rest)])


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def _link(path: Optional[Path], root: Path, text: str) -> str:
    if path is None or not path.exists():
        return DASH
    return f'<a href="{_e(_rel(path, root))}">{_e(text)}</a>'


def _or_dash(value: object) -> str:
    return DASH if value is None else str(value)


def _badge(status: str, label: Optional[str] = None) -> str:
    return f'<span class="badge b-{_e(status)}">{_e(label or status.upper())}</span>'


def check_step(check: Check) -> Optional[int]:
    """The step a check's detail names first (``worst step 3: ...``), None if it names none."""
    match = _STEP.search(check.detail)
    return int(match.group(1)) if match else None


def _bound(c: Check) -> str:
    return (f"{fmt_num(c.lower, 4)} .. {fmt_num(c.bound, 4)}" if c.lower is not None
            else fmt_num(c.bound, 4))


def _check_state(c: Check) -> str:
    return "figure" if c.figure else "n/a" if not c.applicable else "passed" if c.passed else "FAILED"


def _checks_table(checks: Iterable[Check], cls: str = "checks") -> list[str]:
    out = [f'<table class="{cls}"><tr><th>check</th><th>state</th><th>value</th><th>bound</th>'
           "<th>step</th><th>detail</th></tr>"]
    for c in checks:
        step = check_step(c)
        out.append(f'<tr class="check{" failed" if not c.passed else ""}" data-check="{_e(c.name)}">'
                   f"<td>{_e(c.name)}</td><td>{_check_state(c)}</td>"
                   f'<td class="num">{_e(fmt_num(c.value, 4))}</td><td class="num">{_e(_bound(c))}</td>'
                   f'<td class="num">{DASH if step is None else step}</td><td>{_e(c.detail)}</td></tr>')
    out.append("</table>")
    return out


# --------------------------------------------------------------------------- head and overview
def _head(sweep: SweepView, generated_at: datetime) -> list[str]:
    result = gate_result(sweep)
    first, *rest = result.message.splitlines()
    root = sweep.sweep_dir
    links = " ".join(_link(root / f, root, f) for f in (SUMMARY_FILE, JUNIT_FILE, INDEX_FILE))
    out = [f"<h1>dcp-harness sweep <code>{_e(sweep.name)}</code></h1>",
           f'<p class="gate {_e(sweep.status)}" id="gate">{_e(first)}</p>']
    if rest:
        out.append(f'<pre id="gate-lines">{_e(chr(10).join(line.strip() for line in rest))}</pre>')
    out.append(f'<p class="note">generated {_e(generated_at.replace(microsecond=0).isoformat())} '
               f"from the sweep folder; {links}</p>")
    out.append('<nav><a href="#failures">failing checks</a><a href="#errors">errors</a>'
               '<a href="#entries">cases and entries</a><a href="#skipped">skipped</a>'
               '<a href="#cases">per case</a></nav>')
    return out


def _entries(sweep: SweepView) -> list[str]:
    out = ['<section id="entries"><h2>Cases and entries</h2>',
           "<p class=note>Figures per arm, in pair order (candidate / reference): final loss, "
           "peak allocated memory (CUDA), median step time after the first step.</p>",
           '<table id="entry-table"><tr><th>case / entry (arms)</th><th>status</th><th>checks</th>'
           "<th>why</th><th>final loss</th><th>peak mem</th><th>step time</th></tr>"]
    for case in sweep.cases:
        label = case.parked.outcome if case.parked is not None else case.verdict.status.upper()
        out.append(f'<tr class="case {_e(case.verdict.status)}" data-case="{_e(case.case_id)}">'
                   f'<td colspan="3"><a href="#{anchor(case.case_id)}">{_e(case.title)}</a></td>'
                   f'<td colspan="4">{_badge(case.verdict.status, label)}</td></tr>')
        for p in case.verdict.pairs:
            # a skip's reason in full is under "Skipped, by kind" (and in the cell's tooltip)
            why = (f'<span title="{_e(p.error or "")}">skipped: {_e(p.skip)}</span>'
                   if p.status == "skipped" else _e(entry_why(case, p) or ""))
            out.append(
                f'<tr class="entry {_e(p.status)}" data-case="{_e(case.case_id)}" '
                f'data-pair="{_e(p.pair)}" data-status="{_e(p.status)}">'
                f'<td class="pair"><a href="#{anchor(case.case_id, p.pair)}">{_e(pair_title(p))}</a></td>'
                f"<td>{_badge(p.status, case.entry_label(p.status))}</td><td>{_e(checks_cell(p))}</td>"
                f"<td>{why}</td><td>{_e(final_loss_cell(case, p))}</td>"
                f"<td>{_e(peak_mem_cell(case, p))}</td><td>{_e(step_time_cell(case, p))}</td></tr>")
    out.append("</table>")
    return out


def _repro_lines(case: CaseView, names: Sequence[str]) -> list[str]:
    out = []
    for name in names:
        arm = case.arms.get(name)
        if arm is not None and arm.outcome is not None and arm.outcome.repro:
            log = f" ({_link(arm.log, case.dir.parent, 'log')})" if arm.log else ""
            out.append(f"<li>repro <b>{_e(name)}</b>: <code>{_e(arm.outcome.repro)}</code>{log}</li>")
    return out


def _failures(sweep: SweepView) -> list[str]:
    failing = [(c, p) for c, p in sweep.rows if p.status == "fail"]
    out = ['<section id="failures"><h2>Failing checks</h2>']
    if not failing:
        return out + ["<p class=note>No check failed.</p>"]
    for case, p in failing:
        parked = f" ({case.entry_label(p.status)}, parked: not counted)" if case.parked else ""
        out.append(f'<div class="failure" data-case="{_e(case.case_id)}" data-pair="{_e(p.pair)}">'
                   f'<h3><a href="#{anchor(case.case_id, p.pair)}">{_e(case.title)} / '
                   f"{_e(pair_title(p))}</a>{_e(parked)}</h3>")
        out += _checks_table(p.failed_checks, "checks failing")
        causes = [*arm_causes(case, p), *([f"also: {p.error}"] if p.error else [])]
        out += ["<ul>", *(f"<li>{_e(c)}</li>" for c in causes), *_repro_lines(case, p.arms), "</ul>",
                "</div>"]
    return out


def _errors(sweep: SweepView) -> list[str]:
    errors = [(c, p) for c, p in sweep.rows if p.status == "error"]
    out = ['<section id="errors"><h2>Errors</h2>']
    if sweep.problems:
        out += ["<ul>", *(f'<li class="problem">{_e(x)}</li>' for x in sweep.problems), "</ul>"]
    if not errors and not sweep.problems:
        return out + ["<p class=note>No errors.</p>"]
    for case, p in errors:
        out.append(f'<div class="error" data-case="{_e(case.case_id)}" data-pair="{_e(p.pair)}">'
                   f'<h3><a href="#{anchor(case.case_id, p.pair)}">{_e(case.title)} / '
                   f"{_e(pair_title(p))}</a></h3><ul><li>{_e(p.error or 'error')}</li>"
                   + "".join(_repro_lines(case, p.arms)) + "</ul></div>")
    return out


def _skipped(sweep: SweepView) -> list[str]:
    by_kind: dict[str, list[tuple[CaseView, PairVerdict]]] = {}
    for case, p in sweep.rows:
        if p.status == "skipped" and p.skip is not None:
            by_kind.setdefault(p.skip, []).append((case, p))
    out = ['<section id="skipped"><h2>Skipped, by kind</h2>']
    if not by_kind:
        return out + ["<p class=note>Nothing was skipped.</p>"]
    for kind, rows in sorted(by_kind.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        accepted = "accepted by the gate" if kind in sweep.allowed_skips else "NOT accepted: an error"
        out.append(f'<div class="skip-kind" data-kind="{_e(kind)}"><h3>{_e(kind)} ({len(rows)}, '
                   f"{accepted})</h3><p class=note>{_e(SKIP_KINDS.get(kind, ''))}</p><ul>")
        reasons: dict[str, dict[tuple[str, str], list[str]]] = {}  # reason -> case -> entries
        for case, p in rows:
            reasons.setdefault(p.error or "skipped", {}).setdefault(
                (case.case_id, case.title), []).append(p.pair)
        for why, cases in reasons.items():
            listed = "; ".join(f'<a href="#{anchor(cid)}">{_e(title)}</a>: {_e(", ".join(ps))}'
                               for (cid, title), ps in cases.items())
            out.append(f"<li><b>{_e(why)}</b><br>{listed}</li>")
        out.append("</ul></div>")
    return out


def _parked(sweep: SweepView) -> list[str]:
    if not sweep.parked:
        return []
    out = ['<h2 id="parked">Parked (not counted by the gate)</h2><ul>']
    out += [f"<li>{_e(c.parked.line(c.title).strip())}</li>" for c in sweep.parked if c.parked]
    out += [f'<li class="warning">{_e(w.strip())}</li>' for w in sweep.warnings()]
    return out + ["</ul>"]


# --------------------------------------------------------------------------- per case
def _arms_table(case: CaseView, root: Path) -> list[str]:
    out = ['<table class="arms"><tr><th>arm</th><th>outcome</th><th>exit</th><th>wall s</th>'
           "<th>restarts</th><th>steps</th><th>files</th><th>repro</th></tr>"]
    for name, arm in case.arms.items():
        o = arm.outcome
        files = " ".join(x for x in (_link(arm.log, root, "log"),
                                     _link(arm.dir / OUTCOME_FILE, root, "outcome")) if x != DASH)
        status = o.status if o else "no outcome.json"
        out.append(f'<tr class="arm" data-arm="{_e(name)}"><td>{_e(name)}</td><td>{_e(status)}'
                   f"{'<br>' + _e(arm.problem) if arm.problem else ''}</td>"
                   f'<td class="num">{_e(_or_dash(o.returncode if o else None))}</td>'
                   f'<td class="num">{_e(fmt_s(o.wall_s) if o else DASH)}</td>'
                   f'<td class="num">{_e(_or_dash(o.restarts if o else None))}</td>'
                   f'<td class="num">{arm.figures.steps}</td><td>{files or DASH}</td>'
                   f"<td>{'<code>' + _e(o.repro) + '</code>' if o and o.repro else DASH}</td></tr>")
    return out + ["</table>"]


def _rank_table(case: CaseView) -> list[str]:
    rows = []
    for name, arm in case.arms.items():
        probes = memory_probes(arm.steps)
        for rank in sorted(arm.steps):
            f = arm_figures({rank: arm.steps[rank]})
            probe = probes.get(rank)
            label = (case.labels[case.emulated_ranks.index(rank)] if rank in case.emulated_ranks
                     else f"rank {rank}")
            rows.append(f'<tr class="rank" data-arm="{_e(name)}" data-rank="{rank}"><td>{_e(name)}</td>'
                        f"<td>{_e(label)}</td><td class=num>{f.steps}</td>"
                        f"<td class=num>{_e(fmt_num(f.final_loss))}</td>"
                        f"<td class=num>{_e(fmt_gib(f.peak_allocated_bytes))}</td>"
                        f"<td class=num>{_e(fmt_gib(f.peak_reserved_bytes))}</td>"
                        f"<td class=num>{_e(fmt_gib(probe.device_used_bytes) if probe else DASH)}</td>"
                        f"<td class=num>{_e(fmt_s(f.median_step_time_s))}</td></tr>")
    if not rows:
        return []
    loss = "local loss" if case.emulated else "final loss"
    return ["<details><summary>Per-rank figures</summary>",
            '<table class="ranks"><tr><th>arm</th><th>rank</th><th>steps</th>'
            f"<th>{loss}</th><th>peak allocated GiB</th><th>peak reserved GiB</th>"
            "<th>device used after empty_cache GiB</th><th>median step s</th></tr>",
            *rows, "</table></details>"]


def _case(case: CaseView, root: Path, figure: Optional[FigureFn], named: bool = True) -> list[str]:
    """One case's section (``named``: with its anchor as id; a collapsed case's <details> has it)."""
    files = " ".join(x for x in (_link(case.dir / CASE_FILE, root, CASE_FILE),
                                 _link(case.dir / PLAN_FILE, root, PLAN_FILE),
                                 _link(case.dir / VERDICT_FILE, root, VERDICT_FILE)) if x != DASH)
    label = case.parked.outcome if case.parked is not None else None
    name = f' id="{anchor(case.case_id)}"' if named else ""
    out = [f'<section class="case"{name} data-case="{_e(case.case_id)}">',
           f"<h2>{_e(case.title)} {_badge(case.verdict.status, label)}</h2>",
           f"<p class=note>{files}</p>"]
    if case.emulated:
        out.append("<p class=note>Emulated ranks: each rank ran alone on one device, loopback "
                   "communication; not a multi-GPU run. Losses and grad norms are each rank's own.</p>")
    out += _arms_table(case, root)
    for p in case.verdict.pairs:
        out.append(f'<div class="pair" id="{anchor(case.case_id, p.pair)}" data-pair="{_e(p.pair)}">'
                   f"<h3>{_e(pair_title(p))} {_badge(p.status, case.entry_label(p.status))} "
                   f"<span class=note>{_e(p.contract)}, checks {_e(checks_cell(p))}</span></h3>")
        if p.error:
            out.append(f"<p>{_e(p.error)}</p>")
        if p.checks:
            out += [f"<details{' open' if p.status == 'fail' else ''}><summary>checks</summary>",
                    *_checks_table(p.checks), "</details>"]
        svg = figure(case, p) if figure is not None else None
        if svg:
            out.append(f'<div class="figure">{svg}</div>')
        out.append("</div>")
    return out + _rank_table(case) + ["</section>"]


def _collapsed(sweep: SweepView, cases: Sequence[CaseView]) -> list[str]:
    """The passing cases of a large sweep, each a closed <details> whose section (without curves)
    the page's script puts in when it opens (``LAZY_SCRIPT``), from one gzip of their sections'
    JSON in base64 (no "<" in it, so nothing in it can end its <script>)."""
    out = [f'<h3 id="collapsed">Passing cases ({len(cases)}), collapsed</h3>',
           f"<p class=note>This sweep has {len(sweep.cases)} cases: the ones that did not pass are "
           "shown above in full with their curves; each passing case opens here with its arms, "
           "checks and per-rank figures (its curves are not drawn, nor its plots/ PNG).</p>"]
    for case in cases:
        out.append(f'<details class="lazy" id="{anchor(case.case_id)}" data-case="{_e(case.case_id)}">'
                   f"<summary>{_e(case.title)} {_badge(case.verdict.status)}</summary></details>")
    data = {case.case_id: "\n".join(_case(case, sweep.sweep_dir, None, named=False))
            for case in cases}
    packed = gzip.compress(json.dumps(data).encode(), compresslevel=6, mtime=0)  # ~1/18 the size
    return out + [f'<script type="application/gzip+base64" id="lazy-cases">'
                  f"{base64.b64encode(packed).decode()}</script>", f"<script>{LAZY_SCRIPT}</script>"]


def render_page(sweep: SweepView, generated_at: datetime, figure: Optional[FigureFn],
                note: Optional[str] = None, full: Optional[Collection[str]] = None) -> str:
    """The page's HTML text; ``figure`` draws an entry's curves (None: no figures, ``note``
    says why). ``full`` (default: every case) are the cases shown in full, with curves, first;
    the others are collapsed below them (:func:`_collapsed`)."""
    status = sweep.status.upper()
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{_e(status)}: dcp-harness sweep {_e(sweep.name)}</title>",
           f"<style>{STYLE}</style></head><body>"]
    out += _head(sweep, generated_at)
    if note:
        out.append(f'<p class="note" id="page-note">{_e(note)}</p>')
    if not sweep.cases:
        out.append("<p>No case folders found (a case folder holds case.json or verdict.json).</p>")
    else:
        for section in (_failures, _errors, _entries, _skipped):  # each opens a <section>
            out += section(sweep) + ["</section>"]
        out += _parked(sweep)
        out.append('<h2 id="cases">Per case</h2>')
        shown = [c for c in sweep.cases if full is None or c.case_id in full]
        for case in shown:
            out += _case(case, sweep.sweep_dir, figure)
        rest = [c for c in sweep.cases if full is not None and c.case_id not in full]
        if rest:
            out += _collapsed(sweep, rest)
    out.append("</body></html>")
    return "\n".join(out) + "\n"
