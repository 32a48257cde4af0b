"""How fast the history is: adding a focused sweep, and `history show` / `check` over 10,000
synthetic sweeps on SQLite (docs/history.md; figures in bench/RESULTS-log.md).

* add: ``record_sweep`` of a real sweep folder into a fresh database, judged as ``history add``
  judges it (the stored-plan check, every case judged again), then with the view judged already
  (what the end of ``run`` pays), then the same sweep again (a no-op). Median of ``--repeats``.
* show / check: a database of ``--sweeps`` synthetic sweeps of ``--cases`` cases (two arms each,
  each with the figures a GPU arm records), written through the history's own ``store``; then
  ``dcp-harness history show CASE --metric step_time_median_s`` (the last 20 sweeps), ``show``
  of every series (each printed only, and printed and plotted to a PNG), and ``check``, timed in
  this process, and the first as a fresh ``dcp-harness`` process (interpreter and imports).

Targets (issue 39): add < 1 s; show over 10,000 sweeps < 1 s. Exit 0 when both are met, 1 if not.

    python bench/history_speed.py [--sweep DIR] [--sweeps 10000] [--cases 5] [--json OUT]

Without ``--sweep`` it runs ``dcp-harness run cases/focused`` into a temporary folder first.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.cli import main as cli  # noqa: E402
from harness.history import open_history, record_sweep  # noqa: E402
from harness.history.extract import ArmRow, CaseRow, FigureRow, PairRow, SweepRecord  # noqa: E402
from harness.history.schema import ARM, WHOLE  # noqa: E402
from harness.history.store import store  # noqa: E402
from harness.trust.stored_plan import check_stored_plan  # noqa: E402
from harness.report import load_sweep  # noqa: E402

ADD_TARGET_S = 1.0
SHOW_TARGET_S = 1.0
METRICS = ("final_loss", "step_time_median_s", "peak_allocated_bytes", "peak_reserved_bytes",
           "device_used_bytes", "graph_pool_bytes", "wall_s")


CPU_S: dict[str, float] = {}  # the same timings as this process's CPU time (the machine's load aside)


def timed(fn: Callable[[], Any], repeats: int, name: str = "") -> float:
    """The median wall time of ``repeats`` calls (and, under ``name``, their median CPU time)."""
    times, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    if name:
        CPU_S[name] = statistics.median(cpu)
    return statistics.median(times)


def focused_sweep(work: Path) -> Path:
    out = work / "focused"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "harness", "run", str(ROOT / "cases" / "focused"),
                    "--out", str(out)], env=env, check=False, capture_output=True, timeout=3600)
    return out


def bench_add(sweep: Path, work: Path, repeats: int) -> dict[str, float]:
    counter = iter(range(10 ** 6))

    def fresh() -> str:
        return f"sqlite:///{work / f'add-{next(counter)}.sqlite'}"

    view = load_sweep(sweep, check_stored_plan)
    same = fresh()
    record_sweep(sweep, url=same)
    return {"judged_s": timed(lambda: record_sweep(sweep, url=fresh()), repeats, "judged"),
            "with_view_s": timed(lambda: record_sweep(sweep, url=fresh(), view=view), repeats,
                                 "with_view"),
            "again_s": timed(lambda: record_sweep(sweep, url=same, view=view), repeats, "again"),
            "figures": record_sweep(sweep, url=same, view=view).figures}


def synthetic(i: int, cases: int) -> SweepRecord:
    """Night ``i``: ``cases`` cases of two arms, figures creeping slowly."""
    started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(1.6e9 + 86400 * i))
    rows, figs = [], []
    for c in range(cases):
        cid = f"case-{c:02d}"
        for arm in ("dcp", "fixed-cp2"):
            rows.append(ArmRow(cid, arm, "ok", "h100", 4, 16, None, None))
            figs += [FigureRow(cid, arm, ARM, WHOLE, m, "h100", (1 + 1e-5 * i) * (n + 1))
                     for n, m in enumerate(METRICS)]
    return SweepRecord(
        key=f"synthetic-{i}", name=f"night{i:05d}", path=f"/sweeps/night{i:05d}", started=started,
        host="node1", command="submit", selection={}, platform="h100", commit=f"{i:040x}",
        dirty=False, repo="/repo", status="pass", exit_code=0, code=(),
        cases=tuple(CaseRow(f"case-{c:02d}", "h", "pass", f"{i:040x}", False, "h100", False, None)
                    for c in range(cases)),
        pairs=tuple(PairRow(f"case-{c:02d}", "dcp-vs-fixed-cp", "dcp_vs_fixed_cp", "pass", None,
                            None, "") for c in range(cases)),
        arms=tuple(rows), figures=tuple(figs), steps=())


def build(url: str, sweeps: int, cases: int) -> float:
    t = time.perf_counter()
    history = open_history(url)
    try:
        for start in range(0, sweeps, 500):
            with history.write() as conn:
                for i in range(start, min(start + 500, sweeps)):
                    store(conn, synthetic(i, cases))
    finally:
        history.close()
    return time.perf_counter() - t


def quiet(argv: Sequence[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()):
        return cli(list(argv))


def process_s(argv: Sequence[str], repeats: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return timed(lambda: subprocess.run([sys.executable, "-m", "harness", *argv], env=env,
                                        capture_output=True, check=False), repeats)


def bench_show(work: Path, sweeps: int, cases: int, repeats: int) -> dict[str, float]:
    db = work / "synthetic.sqlite"
    url = f"sqlite:///{db}"
    built = build(url, sweeps, cases)
    plot = ["--plot", str(work / "show.png")]
    one = ["history", "show", "case-00", "--metric", "step_time_median_s", "--history", url]
    every = ["history", "show", "--history", url]
    check = ["history", "check", "--history", url]
    quiet(one + plot)  # warm: imports and matplotlib's font cache
    return {"build_s": built, "db_mib": db.stat().st_size / 2 ** 20,
            "show_one_s": timed(lambda: quiet(one + ["--no-plot"]), repeats, "show_one"),
            "show_one_plot_s": timed(lambda: quiet(one + plot), repeats, "show_one_plot"),
            "show_every_s": timed(lambda: quiet(every + ["--no-plot"]), repeats, "show_every"),
            "show_every_plot_s": timed(lambda: quiet(every + plot), repeats, "show_every_plot"),
            "check_s": timed(lambda: quiet(check), repeats, "check"),
            "show_one_process_s": process_s(one + ["--no-plot"], repeats)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", type=Path, help="a sweep folder (default: run cases/focused)")
    p.add_argument("--sweeps", type=int, default=10_000)
    p.add_argument("--cases", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="history-speed-") as tmp:
        work = Path(tmp)
        sweep = args.sweep or focused_sweep(work)
        add = bench_add(sweep, work, args.repeats)
        show = bench_show(work, args.sweeps, args.cases, args.repeats)
    ok = add["with_view_s"] < ADD_TARGET_S and add["judged_s"] < ADD_TARGET_S \
        and show["show_one_s"] < SHOW_TARGET_S
    print(f"add {sweep.name} ({add['figures']} figures): judged as `history add` "
          f"{add['judged_s']:.3f} s, with the run's view {add['with_view_s']:.3f} s, again (no-op) "
          f"{add['again_s']:.3f} s (target < {ADD_TARGET_S:g} s)")
    print(f"{args.sweeps} synthetic sweeps x {args.cases} cases: built in {show['build_s']:.1f} s "
          f"({show['db_mib']:.1f} MiB); `history show CASE --metric M` {show['show_one_s']:.3f} s "
          f"({show['show_one_plot_s']:.3f} s with its PNG; {show['show_one_process_s']:.3f} s as "
          f"a new process); `show` of every series {show['show_every_s']:.3f} s "
          f"({show['show_every_plot_s']:.3f} s with its PNG); `check` {show['check_s']:.3f} s "
          f"(target < {SHOW_TARGET_S:g} s)")
    print("CPU time of the same (this process): " + ", ".join(f"{k} {v:.3f} s"
                                                               for k, v in CPU_S.items()))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average (1 min) at the end: {load:.1f} on {os.cpu_count()} CPU(s)")
    print("PASS" if ok else "FAIL: a target was missed")
    if args.json:
        args.json.write_text(json.dumps({"add": add, "show": show, "cpu_s": CPU_S,
                                         "sweeps": args.sweeps, "cases": args.cases, "ok": ok},
                                        indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
