"""Noise of every history figure over clean sweeps, and the drift rule's false alarms and power.

Two steps, so the slow one runs once and the rule can be measured again and again::

    # 1. clean sweeps of the selected cases, each into DIR/sweep-NN (every 4th with a second
    #    sweep of the same cases running beside it, into DIR/beside-NN), nothing changed between
    python bench/drift_noise.py collect DIR --sweeps 24 cases/focused -k "tiny-moe-eager or tiny-static-cp2"

    # 2. the sweeps into a scratch history, every figure's series, its noise, the false alarms of
    #    the drift rule over every window of the clean series, and the smallest per-sweep creep
    #    caught within 5 sweeps per figure kind and platform (creeps seeded onto the clean series)
    python bench/drift_noise.py analyse DIR            # a Markdown table for bench/RESULTS.md

``collect`` runs ``dcp-harness run`` (CPU here, GPUs where there are), ``--no-history``: the
analysis rebuilds its own history from the folders with the code it runs, so the series are the
ones ``history check`` would read. On one GPU::

    python bench/drift_noise.py collect /tmp/drift-gpu --sweeps 8 --beside-every 0 \\
        cases/focused -k "gpu1-qwen3-perf or tiny-moe-eager"
    python bench/drift_noise.py analyse /tmp/drift-gpu
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _run(paths: Sequence[str], k: Optional[str], out: Path, label: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "harness", "run", *paths, "--out", str(out), "--no-history"]
    if k:
        cmd += ["-k", k]
    if label:
        cmd += ["--label", label]
    log = open(out.with_suffix(".log"), "w")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))


def collect(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    done = len(sorted(root.glob("sweep-*/manifest.json")))
    for n in range(done, done + args.sweeps):
        beside = args.beside_every > 0 and n % args.beside_every == args.beside_every - 1
        t0 = time.monotonic()
        main = _run(args.paths, args.k, root / f"sweep-{n:02d}", args.label)
        other = _run(args.paths, args.k, root / f"beside-{n:02d}", "") if beside else None
        rc = main.wait()
        if other is not None:
            other.wait()
        note = {"sweep": n, "beside": beside, "rc": rc, "wall_s": round(time.monotonic() - t0, 1),
                "load": os.getloadavg()[0]}
        with open(root / "sweeps.jsonl", "a") as f:
            f.write(json.dumps(note) + "\n")
        print(json.dumps(note), flush=True)
    return 0


BURN_PATCH = (
    "    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0\n",
    "    _burn = float(__import__('os').environ.get('DCP_BENCH_BURN', '0'))\n"
    "    _until = time.process_time() + _burn * (time.process_time() - c0)\n"
    "    while _burn and time.process_time() < _until:\n"
    "        pass\n"
    "    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0\n",
)


def _burning_copy(dest: Path) -> Path:
    """A copy of this repository's tracked files whose training step burns DCP_BENCH_BURN x its
    own CPU time more (a real, seeded slowdown; the copy only, never this checkout)."""
    import shutil

    files = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    train = dest / "harness" / "workload" / "train.py"
    text = train.read_text()
    if BURN_PATCH[0] not in text:
        raise SystemExit(f"{train}: the line to patch is gone; update BURN_PATCH")
    train.write_text(text.replace(BURN_PATCH[0], BURN_PATCH[1], 1))
    return dest


def _cli(repo: Path, args: list[str], env_extra: Optional[dict] = None, log: Optional[Path] = None,
         wait: bool = True):  # type: ignore[no-untyped-def]
    env = {**os.environ, "PYTHONPATH": str(repo), **(env_extra or {})}
    out = open(log, "w") if log else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=str(repo), env=env,
                            stdout=out, stderr=subprocess.STDOUT)
    return proc.wait() if wait else proc


def creep(args: argparse.Namespace) -> int:
    """Through the CLI: N clean sweeps labelled nightly (every --beside-every-th beside a second
    sweep), then --creep-sweeps sweeps from a copy whose step burns --creep-pct % more CPU a
    sweep; `history check` after each, its exit code and drift lines printed."""
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    db = root / "history.sqlite"
    copy = _burning_copy(root / "burning-copy")
    select = [*args.paths] + (["-k", args.k] if args.k else [])
    plan = [(n, 0.0) for n in range(args.sweeps)] + [
        (args.sweeps + i, args.creep_pct / 100 * (i + 1)) for i in range(args.creep_sweeps)]
    for n, burn in plan:
        beside = (args.beside_every > 0 and n < args.sweeps
                  and n % args.beside_every == args.beside_every - 1)
        other = _cli(REPO, ["run", *select, "--out", str(root / f"beside-{n:02d}"), "--no-history"],
                     log=root / f"beside-{n:02d}.log", wait=False) if beside else None
        repo, env = (REPO, None) if burn == 0 else (copy, {"DCP_BENCH_BURN": str(burn)})
        rc = _cli(repo, ["run", *select, "--out", str(root / f"night-{n:02d}"), "--history", str(db),
                         "--label", "nightly"], env, log=root / f"night-{n:02d}.log")
        if other is not None:
            other.wait()
        done = subprocess.run([sys.executable, "-m", "harness", "history", "check", "--history",
                               str(db)], cwd=str(REPO), capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        drifts = [line.strip() for line in done.stdout.splitlines() if "DRIFT" in line]
        print(json.dumps({"sweep": f"night-{n:02d}", "burn_pct": round(burn * 100), "beside": beside,
                          "run_rc": rc, "check_rc": done.returncode, "drifts": drifts}), flush=True)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("collect", help="run clean sweeps into DIR/sweep-NN")
    c.add_argument("dir")
    c.add_argument("paths", nargs="+", help="case files or folders")
    c.add_argument("-k", default=None, help="case selection (pytest -k style)")
    c.add_argument("--sweeps", type=int, default=24)
    c.add_argument("--beside-every", type=int, default=4, dest="beside_every",
                   help="every Nth sweep runs beside a second sweep (0: never)")
    c.add_argument("--label", default="", help="the sweeps' label (default none)")
    c.set_defaults(func=collect)
    r = sub.add_parser("creep", help="through the CLI: clean nightly sweeps, then a seeded creep")
    r.add_argument("dir")
    r.add_argument("paths", nargs="+", help="case files or folders")
    r.add_argument("-k", default=None, help="case selection (pytest -k style)")
    r.add_argument("--sweeps", type=int, default=8, help="clean sweeps first")
    r.add_argument("--beside-every", type=int, default=4, dest="beside_every")
    r.add_argument("--creep-sweeps", type=int, default=5, dest="creep_sweeps")
    r.add_argument("--creep-pct", type=float, default=40.0, dest="creep_pct",
                   help="the step's CPU time grows by this %% of itself a sweep")
    r.set_defaults(func=creep)
    a = sub.add_parser("analyse", help="noise, false alarms and detection power of DIR's sweeps")
    a.add_argument("dir")
    a.add_argument("--window", type=int, default=None)
    a.set_defaults(func=analyse)
    y = sub.add_parser("synthetic", help="the rule on synthetic GPU-like series of a stated noise")
    y.add_argument("--sigmas", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    y.add_argument("--series", type=int, default=20)
    y.add_argument("--sweeps", type=int, default=24)
    y.add_argument("--seed", type=int, default=1)
    y.set_defaults(func=synthetic)
    args = p.parse_args(argv)
    return args.func(args)


# ---- analyse -----------------------------------------------------------------------------------

CREEPS_PCT = (0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100)
WITHIN = 5  # a creep must be caught within this many sweeps of its start
CLEAN_BEFORE = 6  # clean sweeps before a seeded creep starts
FLOOR_GRID = (0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.40)


def _load(root: Path) -> dict:
    """Every series of DIR's sweeps (oldest first), read through a scratch history as
    ``history check`` reads it (every label)."""
    import tempfile

    from harness.history import open_history, series
    from harness.history.store import add

    folders = [d for d in sorted(root.glob("sweep-*")) if (d / "index.json").is_file()]
    with tempfile.TemporaryDirectory() as tmp:
        history = open_history(str(Path(tmp) / "noise.sqlite"))
        try:
            for folder in folders:
                add(history, folder)
            with history.read() as conn:
                found = series(conn, last=len(folders) + 1)
        finally:
            history.close()
    return found


def _old_rule(ys: list[float], metric: str) -> bool:
    """The rule before this benchmark (Theil-Sen change over the window > 5 % and > 3 x the
    spread about the line): True where it flagged a drift."""
    n = len(ys)
    slopes = [(ys[j] - ys[i]) / (j - i) for i in range(n) for j in range(i + 1, n)]
    slope = statistics.median(slopes)
    icpt = statistics.median(y - slope * i for i, y in enumerate(ys))
    res = [y - (icpt + slope * i) for i, y in enumerate(ys)]
    mid = statistics.median(res)
    sigma = 1.4826 * statistics.median(abs(r - mid) for r in res)
    rise = slope * (n - 1)
    change = rise / abs(icpt) if icpt else 0.0
    up = metric in ("step_time_median_s", "step_cpu_median_s", "wall_s") or metric.endswith("_bytes")
    return abs(change) > 0.05 and abs(rise) > 3 * sigma and (rise > 0 or not up)


def _checks(pts: list, window: int) -> list[list]:
    """The windows a nightly `history check` sees after each sweep (from the 4th on)."""
    return [pts[max(0, end - window):end] for end in range(4, len(pts) + 1)]


def _false_alarms(found: dict, window: int, judged_time: Optional[dict] = None) -> dict:
    from harness.history import drift

    saved = dict(drift.JUDGED_TIME)
    if judged_time is not None:
        drift.JUDGED_TIME.clear()
        drift.JUDGED_TIME.update(judged_time)
    try:
        checks = 0
        new_fired: dict[int, list[str]] = defaultdict(list)
        old_fired: dict[int, list[str]] = defaultdict(list)
        for key, pts in found.items():
            judged = drift.is_judged(key)
            for i, win in enumerate(_checks(pts, window)):
                checks = max(checks, i + 1)
                if judged and drift.judge_series(key, win, window=window).verdict == "drift":
                    new_fired[i].append(key.label)
                if _old_rule([p.value for p in win], key.metric):
                    old_fired[i].append(key.label)
        return {"checks": checks, "new": dict(new_fired), "old": dict(old_fired)}
    finally:
        drift.JUDGED_TIME.clear()
        drift.JUDGED_TIME.update(saved)


def _seeded(pts: list, start: int, pct: float) -> list:
    """``pts`` with a creep of ``pct`` % a sweep from index ``start`` on (relative to the level:
    the median of the points before)."""
    from dataclasses import replace

    level = statistics.median(p.value for p in pts[:start])
    return [p if i < start else replace(p, value=p.value + level * pct / 100 * (i - start + 1))
            for i, p in enumerate(pts)]


def _caught(key, pts: list, start: int, pct: float, window: int) -> tuple[bool, bool]:
    """(caught within WITHIN sweeps, its start named within one sweep) of a creep seeded at
    ``start``: the checks after its first WITHIN sweeps."""
    from harness.history.drift import judge_series

    crept = _seeded(pts, start, pct)
    for end in range(start + 1, min(start + WITHIN, len(crept)) + 1):
        j = judge_series(key, crept[max(0, end - window):end], window=window)
        if j.verdict == "drift":
            at = next(i for i, p in enumerate(crept) if p is j.moved_at or p == j.moved_at)
            return True, abs(at - start) <= 1
    return False, False


def _detection(found: dict, window: int) -> dict:
    """Per (kind, platform): (the smallest creep (% a sweep) caught within WITHIN sweeps in every
    seeding (each judged series, each start leaving CLEAN_BEFORE clean sweeps before and WITHIN
    after), how often its start was named within one sweep, the seedings, the smallest creep
    caught in 90 % of them)."""
    from harness.history.drift import is_judged, kind_of

    trials: dict[tuple[str, str], list] = defaultdict(list)
    for key, pts in found.items():
        if not is_judged(key):
            continue
        starts = range(CLEAN_BEFORE, len(pts) - WITHIN + 1, 2)
        trials[(kind_of(key.metric) or "?", key.platform)] += [(key, pts, s) for s in starts]
    out = {}
    for group, cases in trials.items():
        most = None  # the smallest creep caught in 90 % of the seedings
        for pct in CREEPS_PCT:
            got = [_caught(key, pts, s, pct, window) for key, pts, s in cases]
            rate = sum(c for c, _ in got) / len(got) if got else 0.0
            if most is None and rate >= 0.9:
                most = pct
            if got and rate == 1.0:
                out[group] = (pct, sum(n for _, n in got) / len(got), len(got), most)
                break
        else:
            out[group] = (None, 0.0, len(cases), most)
    return out


def _noise_rows(found: dict) -> list[str]:
    from harness.history.drift import is_judged

    rows = []
    for key, pts in found.items():
        ys = [p.value for p in pts]
        mid = statistics.median(ys)
        if not mid:
            continue
        sd = 1.4826 * statistics.median(abs(y - mid) for y in ys) / abs(mid)
        spreads = [p.spread for p in pts if p.spread is not None]
        own = statistics.median(spreads) / abs(mid) if spreads else None
        rows.append(f"| {key.case_id} / {key.subject} | {key.metric} | {key.platform} | {len(ys)} "
                    f"| {sd * 100:.2f} | {(max(ys) / mid - 1) * 100:+.1f} | "
                    f"{(min(ys) / mid - 1) * 100:+.1f} | "
                    f"{'-' if own is None else f'{own * 100:.1f}'} | "
                    f"{'judged' if is_judged(key) else 'shown'} |")
    return rows


def synthetic(args: argparse.Namespace) -> int:
    """The rule on synthetic GPU-like series (normal noise of a given sigma, no load bursts):
    false alarms and the smallest creep caught, per kind, where no GPU run is at hand. Not a
    measurement of a machine: a check of the rule's arithmetic at a stated noise."""
    import random

    from harness.history.drift import judge_series
    from harness.history.query import Point, SeriesKey

    rng = random.Random(args.seed)
    print("| kind (figure, platform h100) | sigma % | false alarms / checks | smallest creep caught "
          "in 90 % of seedings, % a sweep | in every seeding | start named within one sweep |")
    print("| --- | --- | --- | --- | --- | --- |")
    for metric, base in (("step_time_median_s", 0.25), ("peak_allocated_bytes", 4e9),
                         ("final_loss", 4.3)):
        for sigma in args.sigmas:
            found = {}
            for n in range(args.series):
                key = SeriesKey(f"syn{n}", "arm", "eager", -1, metric, "h100")
                found[key] = [Point(f"s{i:02d}", "", f"2026-01-01T00:{i:02d}:00", None, None, "h",
                                    base * (1 + rng.gauss(0, sigma / 100))) for i in range(args.sweeps)]
            fired = sum(judge_series(k, w).verdict == "drift"
                        for k, pts in found.items() for w in _checks(pts, 10))
            checks = sum(len(_checks(pts, 10)) for pts in found.values())
            det = _detection(found, 10)
            (pct, named, _, most), = det.values()
            print(f"| {metric} | {sigma:g} | {fired} / {checks} | {most if most else '> 100'} | "
                  f"{pct if pct else '> 100'} | {named * 100:.0f} % |")
    return 0


def analyse(args: argparse.Namespace) -> int:
    from harness.history import drift

    root = Path(args.dir)
    found = _load(root)
    notes = [json.loads(line) for line in (root / "sweeps.jsonl").read_text().splitlines()
             if line.strip()] if (root / "sweeps.jsonl").is_file() else []
    n = max((len(p) for p in found.values()), default=0)
    window = args.window or drift.DEFAULT_WINDOW
    beside = sum(1 for x in notes if x.get("beside"))
    print(f"## {n} clean sweeps in {root} ({beside} beside a second sweep), window {window}\n")
    print("Noise per figure over the clean sweeps (relative %: robust sigma = 1.4826 MAD / median; "
          "max / min from the median; own = the median of the sweeps' own standard error):\n")
    print("| case / arm | figure | platform | n | sigma % | max % | min % | own % | rule |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(_noise_rows(found)))
    platforms = sorted({k.platform for k in found})
    print("\nFalse alarms: a `history check` after each clean sweep (from the 4th), any figure "
          "flagged as drift:\n")
    print("| rule | step time judged | checks | checks with a false alarm | figures flagged |")
    print("| --- | --- | --- | --- | --- |")
    variants = [("new", None, "per platform (" + ", ".join(
        f"{p}: {drift.JUDGED_TIME.get(p, drift.DEFAULT_JUDGED_TIME)}" for p in platforms) + ")")]
    if "cpu" in platforms:
        variants.append(("new", {}, "cpu: step_time_median_s (wall clock)"))
    for rule, judged, what in variants:
        fa = _false_alarms(found, window, judged)
        fired = fa[rule]
        print(f"| {rule} | {what} | {fa['checks']} | {len(fired)} | "
              f"{sum(len(v) for v in fired.values())} |")
    fa = _false_alarms(found, window)
    print(f"| old (Theil-Sen, 5 %, 3 x spread about the line; every figure) | - | {fa['checks']} | "
          f"{len(fa['old'])} | {sum(len(v) for v in fa['old'].values())} |")
    if "cpu" in platforms:
        print("\nThe CPU step-time floor (sigma): false alarms and the smallest creep caught at "
              "each floor:\n")
        print("| floor % | judged | checks with a false alarm | smallest creep caught in 90 % of "
              "seedings, % a sweep | in every seeding |")
        print("| --- | --- | --- | --- | --- |")
        saved = drift.FLOORS[("time", True)]
        for judged, name in ((None, "step_cpu_median_s"), ({}, "step_time_median_s")):
            for floor in FLOOR_GRID:
                drift.FLOORS[("time", True)] = floor
                saved_j = dict(drift.JUDGED_TIME)
                if judged is not None:
                    drift.JUDGED_TIME.clear()
                fired = _false_alarms(found, window)["new"]
                det = _detection({k: v for k, v in found.items()
                                  if drift.kind_of(k.metric) == "time"}, window)
                drift.JUDGED_TIME.update(saved_j)
                pct, _, _, most = det.get(("time", "cpu"), (None, 0, 0, None))
                print(f"| {floor * 100:g} | {name} | {len(fired)} | {most if most else '> 100'} | "
                      f"{pct if pct else '> 100'} |")
        drift.FLOORS[("time", True)] = saved
    print(f"\nDetection: the smallest creep (% of the level a sweep) caught within {WITHIN} sweeps "
          f"in every seeding ({CLEAN_BEFORE}+ clean sweeps before it), and how often the first moved "
          "sweep was named within one sweep of the true start:\n")
    print("| kind | platform | smallest creep caught in 90 % of seedings, % a sweep | in every "
          "seeding | start named within one sweep | seedings |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (kind, platform), (pct, named, count, most) in sorted(_detection(found, window).items()):
        print(f"| {kind} | {platform} | {most if most is not None else '> 100'} | "
              f"{pct if pct is not None else '> 100'} | {named * 100:.0f} % | {count} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
