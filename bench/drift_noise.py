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
    a = sub.add_parser("analyse", help="noise, false alarms and detection power of DIR's sweeps")
    a.add_argument("dir")
    a.add_argument("--window", type=int, default=None)
    a.set_defaults(func=analyse)
    args = p.parse_args(argv)
    return args.func(args)


def analyse(args: argparse.Namespace) -> int:
    raise SystemExit("not yet")


if __name__ == "__main__":
    sys.exit(main())
