"""The harness's own cost at scale: sweeps of 10, 100 and 1,000 cases (issue 50, item 4).

Each sweep is synthesized from a real case file (``cases/regression/gb200-qwen3-30b-a3b-dcp-
graphs.yaml``: 4 arms of 8 ranks, 3 pairs), varied by name and seed: one case file per ten
cases, each a ``matrix: {train.seed: [...]}`` of ten seeds, ``train.steps`` 20. Every case is
planned by the harness (``arms.plan_case``), its folder prepared as a run prepares it
(``launch.sweep.prepare_case_dir``: ``case.json``, ``plan.json``, the manifest with a start), and
every arm's step records are written through ``results.StepWriter`` (``bench/page_size.py``'s
GB200-like figures: loss, grad norm, step time, memory, a memory probe, the graph arms' capture
statistics and replays) with an ``ok`` outcome. One case in fifty has its graph arm drift, so its
entries fail. Writing the records is not timed (each append's fsync is skipped while they are
written: the harness's reading cost is what is measured, not this disk's).

Then, each step a fresh ``python -m harness ...`` process (interpreter and imports included, as a
user runs it), its wall and CPU time and the load average beside it:

* ``validate``: ``dcp-harness validate CASES`` (load, expand, preflight, plan, pack every step);
* ``judge``: every case folder judged once and its ``verdict.json`` written
  (``launch.sweep.finalize_case``: what ``run`` does at the end of each case);
* ``report``: ``dcp-harness report SWEEP`` (summary, JUnit, index.json, index.html, plots), then
  index.html's size and the time headless Chromium takes to open it (``tests/browser.py``);
* ``gate``: ``dcp-harness gate SWEEP`` (every case re-judged from its records; with
  ``--baseline``: ``same_gate_output`` says whether both codes printed the same bytes);
* ``history``: ``dcp-harness history add SWEEP`` into a fresh SQLite file (with ``--baseline``:
  ``same_rows`` says whether both codes stored the same rows, every table, but when each was added
  and the sweep's fingerprint, each code's own hash of them).

``--baseline DIR`` (a copy of another commit's tree, e.g. ``git archive BASE | tar -x -C DIR``)
runs the same steps with that code on the same sweep, side by side (new / old), in one run.
``--profile DIR`` writes each step's cProfile (``DIR/<n>-<step>.prof``). ``--keep`` keeps each
size's sweep in ``--work`` and takes one kept there by an earlier run (the 1,000-case sweep takes
minutes to write); ``--steps`` times only the steps named.

    python bench/scale.py --sizes 10 100 1000 --work /tmp/scale [--baseline /tmp/old] [--json OUT]

Targets (issue 50): each step grows at most linearly; at 1,000 cases gate <= 30 s and history
add <= 10 s on two cores. Exit 0 when both hold at the largest size given, 1 if not.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from page_size import write_arms  # noqa: E402

from harness.arms import plan_case  # noqa: E402
from harness.launch.sweep_folder import prepare_case_dir, record_manifest, sweep_start  # noqa: E402
from harness.report import PAGE_FILE  # noqa: E402
from harness.spec import load_cases  # noqa: E402

TEMPLATE = ROOT / "cases" / "regression" / "gb200-qwen3-30b-a3b-dcp-graphs.yaml"
PER_FILE = 10  # cases per case file (a matrix of seeds)
STEPS = 20
FAIL_EVERY = 50  # one case in this many fails (its graph arm's loss drifts)
GATE_TARGET_S = 30.0
HISTORY_TARGET_S = 10.0
TARGET_CASES = 1000
STEP_NAMES = ("validate", "judge", "report", "gate", "history", "record")

# Judge every case folder of a sweep once and write its verdict.json, as `run` does per case
# (``finalize_case``: in ``launch.sweep_folder``, in ``launch.sweep`` before issue 49's split).
JUDGE_ALL = """import sys
from pathlib import Path
try:
    from harness.launch.sweep_folder import finalize_case
except ImportError:
    from harness.launch.sweep import finalize_case
for case_dir in sorted(Path(sys.argv[1]).iterdir()):
    if (case_dir / "plan.json").is_file():
        finalize_case(case_dir)
"""

# The history's own part of `history add`: a sweep judged already (as `run` hands it over at its
# end; not timed) written into a fresh database: its rows made and stored (timed, printed).
RECORD = """import json, sys, time
from pathlib import Path
from harness.history import open_history
from harness.history.extract import sweep_record
from harness.history.store import write_record
from harness.report import load_sweep
from harness.results import read_manifest
sweep = Path(sys.argv[1])
view = load_sweep(sweep)
t, c = time.perf_counter(), time.process_time()
history = open_history(sys.argv[2])
write_record(history, sweep_record(view, read_manifest(sweep)))
history.close()
print(json.dumps({"inner_wall_s": time.perf_counter() - t, "inner_cpu_s": time.process_time() - c}))
"""


# --------------------------------------------------------------------------- the sweep
def write_case_files(folder: Path, cases: int, steps: int = STEPS) -> list[Path]:
    """``cases`` cases of the template, ``PER_FILE`` per file (a matrix of seeds), in ``folder``."""
    template = yaml.safe_load(TEMPLATE.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for first in range(0, cases, PER_FILE):
        data = json.loads(json.dumps(template))
        data["name"] = f"scale-{first // PER_FILE:04d}"
        data["train"]["steps"] = steps
        data["matrix"] = {"train.seed": [1000 + n for n in range(first, min(first + PER_FILE, cases))]}
        path = folder / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        files.append(path)
    return files


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """Appends without their fsync while records are synthesized (module doc)."""
    real = os.fsync
    os.fsync = lambda fd: None  # type: ignore[assignment]
    try:
        yield
    finally:
        os.fsync = real  # type: ignore[assignment]


SYNTHESIZED = "synthesized.json"  # in a size's folder: its sweep is complete (the seconds it took)


def synthesize(work: Path, cases: int, steps: int = STEPS, reuse: bool = False
               ) -> tuple[Path, Path, dict[str, float]]:
    """(case folder, sweep folder, seconds taken by planning / preparing / writing records).
    ``reuse``: a sweep this function completed in ``work`` before is taken as it is."""
    case_dir, sweep = work / "cases", work / "sweep"
    done = work / SYNTHESIZED
    if reuse and done.is_file() and sweep.is_dir():
        return case_dir, sweep, json.loads(done.read_text())
    if sweep.exists():
        raise SystemExit(f"{sweep} exists but is not a complete sweep of this bench: give a new "
                         "--work folder")
    write_case_files(case_dir, cases, steps)
    t = time.perf_counter()
    loaded = load_cases([case_dir])
    plans = [plan_case(case) for case in loaded]
    planned = time.perf_counter() - t
    start = sweep_start("run", loaded, gpus=8,
                        paths=[str(case_dir)])
    t = time.perf_counter()
    record_manifest(plans, sweep, start)
    folders = [prepare_case_dir(plan, sweep, listed=True) for plan in plans]  # as the backends do
    prepared = time.perf_counter() - t
    t = time.perf_counter()
    with no_fsync():
        for n, (plan, folder) in enumerate(zip(plans, folders)):
            drift = plan.arms[0].name if n % FAIL_EVERY == 0 else None
            write_arms(plan, folder, drift, f"dcp-harness submit {case_dir} -k {plan.case_id}")
    written = time.perf_counter() - t
    seconds = {"plan_s": planned, "prepare_s": prepared, "records_s": written}
    done.write_text(json.dumps(seconds))
    return case_dir, sweep, seconds


# --------------------------------------------------------------------------- timing
def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_step(code: Path, argv: Sequence[str], profile: Optional[Path] = None) -> dict[str, Any]:
    """One fresh ``python`` process of ``code``'s harness: wall and CPU seconds, load average
    before and after, exit code (and its last output lines when it is not the expected one)."""
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    cmd = [sys.executable, *(["-m", "cProfile", "-o", str(profile)] if profile else []), *argv]
    load0, cpu0, t0 = os.getloadavg()[0], _child_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=str(code), capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _child_cpu() - cpu0
    out = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
           "load": [round(load0, 2), round(os.getloadavg()[0], 2)], "rc": proc.returncode,
           "stdout_sha256": hashlib.sha256(proc.stdout.encode()).hexdigest()[:16]}
    if proc.returncode not in (0, 1):
        out["tail"] = (proc.stdout + proc.stderr)[-2000:]
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    if last[0].startswith('{"inner'):  # a step that times its own part (RECORD)
        out.update({k[len("inner_"):]: round(v, 2) for k, v in json.loads(last[0]).items()})
        out["rc"] = proc.returncode
    return out


def open_page(page: Path, repeats: int = 3) -> dict[str, Any]:
    """index.html in headless Chromium: median wall time of ``repeats`` loads (WebDriver's ``get``
    returns after the load event), the browser's ``loadEventEnd``, and what is shown first."""
    from tests.browser import start_browser

    with tempfile.TemporaryDirectory() as profile:
        browser = start_browser(Path(profile))
        try:
            walls, loads = browser.timed_opens(page, repeats)
            nodes = browser.js("return document.getElementsByTagName('*').length;")
        finally:
            browser.driver.quit()
    return {"bytes": page.stat().st_size, "open_s": round(sorted(walls)[len(walls) // 2], 3),
            "load_event_s": round(sorted(loads)[len(loads) // 2], 3), "dom_nodes": nodes}


def measure(code: Path, case_dir: Path, sweep: Path, work: Path, label: str,
            profile: Optional[Path] = None, browser: bool = True,
            skip: Sequence[str] = ()) -> dict[str, Any]:
    """Every step of the module doc (but those in ``skip``) with ``code``'s harness on ``sweep``."""
    def prof(step: str) -> Optional[Path]:
        return profile / f"{label}-{step}.prof" if profile else None

    db = work / f"history-{label}.sqlite"
    for old in (db, work / f"record-{label}.sqlite"):
        old.unlink(missing_ok=True)
    steps = {
        "validate": ["-m", "harness", "validate", str(case_dir)],
        "judge": ["-c", JUDGE_ALL, str(sweep)],
        "report": ["-m", "harness", "report", str(sweep)],
        "gate": ["-m", "harness", "gate", str(sweep)],
        "history": ["-m", "harness", "history", "add", str(sweep), "--history", f"sqlite:///{db}"],
        "record": ["-c", RECORD, str(sweep), f"sqlite:///{work / f'record-{label}.sqlite'}"],
    }
    out: dict[str, Any] = {}
    for name, argv in steps.items():
        if name in skip:
            continue
        if argv[0] == "-c":  # as a file (cProfile runs a file, not -c)
            script = work / f"{name}.py"
            script.write_text(argv[1])
            argv = [str(script), *argv[2:]]
        out[name] = run_step(code, argv, prof(name))
        if name == "report" and browser:
            out["page"] = open_page(sweep / PAGE_FILE)
    return out


NOT_COMPARED = ("recorded", "fingerprint")  # columns of `sweeps` two codes may fill differently


def table_rows(db: Path) -> dict[str, list[tuple]]:
    """Every row of every table of a history file, in rowid order, but the time each sweep was
    added (``sweeps.recorded``) and its fingerprint (a hash each code may make its own way:
    ``SweepRecord.fingerprint``; the rows it stands for are compared)."""
    conn = sqlite3.connect(db)
    try:
        out = {}
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            cols = [c[1] for c in conn.execute(f'PRAGMA table_info("{table}")') if c[1] not in NOT_COMPARED]
            names = ", ".join(f'"{c}"' for c in cols)
            out[table] = conn.execute(f'SELECT {names} FROM "{table}" ORDER BY rowid').fetchall()
        return out
    finally:
        conn.close()


def same_rows(old: Path, new: Path) -> bool:
    """Whether two codes' `history add` of one sweep stored the same rows (module doc)."""
    return table_rows(old) == table_rows(new)


def growth(results: dict[int, dict[str, Any]], code: str) -> dict[str, list[Optional[float]]]:
    """Per step, each size's wall time over the previous size's (10x the cases: <= 10 is linear)."""
    sizes = sorted(results)
    out: dict[str, list[Optional[float]]] = {}
    for step in STEP_NAMES:
        out[step] = [round(results[b][code][step]["wall_s"] / max(results[a][code][step]["wall_s"],
                                                                  1e-9), 1)
                     if step in results[a].get(code, {}) and step in results[b].get(code, {}) else None
                     for a, b in zip(sizes, sizes[1:])]
    return out


def limits(pairs: Sequence[str]) -> dict[str, int]:
    """``STEP=N`` -> {STEP: N}: the step runs only at sizes up to N."""
    out = {}
    for pair in pairs:
        step, _, n = pair.partition("=")
        if step not in STEP_NAMES or not n.isdigit():
            raise SystemExit(f"--limit/--old-limit {pair!r}: give STEP=N, STEP one of {STEP_NAMES}")
        out[step] = int(n)
    return out


def run_sizes(sizes: Sequence[int], work: Path, baseline: Optional[Path], profile: Optional[Path],
              browser: bool, steps: int = STEPS, limit: Optional[dict[str, int]] = None,
              old_limit: Optional[dict[str, int]] = None, keep: bool = False,
              only: Sequence[str] = ()) -> dict[str, Any]:
    results: dict[int, dict[str, Any]] = {}
    for n in sizes:
        folder = work / f"n{n}"
        case_dir, sweep, synth = synthesize(folder, n, steps, reuse=keep)
        entry: dict[str, Any] = {"synthesis": {k: round(v, 2) for k, v in synth.items()}}
        codes = {"new": ROOT, **({"old": baseline} if baseline else {})}
        # The old code first, then the new: each judges the same records and writes its own files.
        for label in sorted(codes, reverse=True):
            most = {**(limit or {}), **((old_limit or {}) if label == "old" else {})}
            skip = [step for step, m in most.items() if n > m]
            skip += [step for step in STEP_NAMES if only and step not in only]
            entry[label] = measure(codes[label], case_dir, sweep, folder, f"{n}-{label}",
                                   profile, browser, skip)
            print(json.dumps({"cases": n, label: entry[label]}), flush=True)
        if "gate" in entry.get("new", {}) and "gate" in entry.get("old", {}):
            entry["same_gate_output"] = (entry["new"]["gate"]["stdout_sha256"]
                                         == entry["old"]["gate"]["stdout_sha256"])
        if "history" in entry.get("new", {}) and "history" in entry.get("old", {}):
            entry["same_rows"] = same_rows(folder / f"history-{n}-old.sqlite",
                                           folder / f"history-{n}-new.sqlite")
            print(json.dumps({"cases": n, "same_rows": entry["same_rows"]}), flush=True)
        results[n] = entry
        if not keep:
            shutil.rmtree(folder / "sweep", ignore_errors=True)  # hundreds of MB at 1,000 cases
    summary: dict[str, Any] = {"sizes": list(sizes), "results": results,
                               "growth": {c: growth(results, c) for c in results[sizes[0]]
                                          if c in ("new", "old")} if len(sizes) > 1 else {},
                               "cpus": os.cpu_count()}
    last = results[max(sizes)]["new"]
    summary["within"] = (max(sizes) < TARGET_CASES
                         or (last.get("gate", {}).get("wall_s", 1e9) <= GATE_TARGET_S
                             and last.get("history", {}).get("wall_s", 1e9) <= HISTORY_TARGET_S))
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--work", type=Path, required=True, help="a new folder for the sweeps")
    parser.add_argument("--baseline", type=Path, help="another commit's tree: timed side by side")
    parser.add_argument("--profile", type=Path, help="write each step's cProfile here")
    parser.add_argument("--no-browser", action="store_true", dest="no_browser")
    parser.add_argument("--limit", nargs="*", default=[], metavar="STEP=N",
                        help="run STEP only at sizes up to N (e.g. validate=100)")
    parser.add_argument("--old-limit", nargs="*", default=[], metavar="STEP=N", dest="old_limit",
                        help="the same for the --baseline code only")
    parser.add_argument("--keep", action="store_true",
                        help="keep each size's sweep in --work and reuse one kept there before "
                             "(the 1,000-case sweep takes minutes to make)")
    parser.add_argument("--steps", nargs="+", default=[], choices=STEP_NAMES, dest="only",
                        metavar="STEP", help=f"time only these steps (of {', '.join(STEP_NAMES)})")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    summary = run_sizes(args.sizes, args.work, args.baseline, args.profile, not args.no_browser,
                        limit=limits(args.limit), old_limit=limits(args.old_limit),
                        keep=args.keep, only=args.only)
    text = json.dumps(summary, indent=1)
    if args.json:
        args.json.write_text(text)
    print(json.dumps({"growth": summary["growth"], "within": summary["within"]}))
    return 0 if summary["within"] else 1


if __name__ == "__main__":
    sys.exit(main())
