"""How busy a sweep keeps the GPU, per arm (issue 50, item 1).

Two verbs, run from the repository root on the GPU machine::

    python bench/gpu_busy.py sample OUT.csv [--every-ms 200] &   # until killed (SIGTERM/SIGINT)
    python bench/gpu_busy.py arms SWEEP OUT.csv [SWEEP ...] [--json OUT.json]

``sample`` reads NVML every ``--every-ms`` (GPU 0): the time (epoch seconds), the GPU's and the
memory's utilisation (percent of the last sample period the GPU ran a kernel / read or wrote
memory), NVML's device memory used, and each compute process's ``usedGpuMemory``; one CSV row a
sample. ``arms`` lays those rows over the arms of finished sweeps (their ranks' phase marks,
``harness.results.phases``: from the first process's start to the last one's end) and prints per
arm: wall, the mean utilisation over the arm's span and over its steps only (first step started
to last step written), the largest device memory used, and the largest NVML figure of one of its
processes; then, for every sample, NVML used less the sum of the processes (the driver's own: it
stays one constant when the per-process accounting is exact).
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MIB = 2**20


def sample(out: Path, every_ms: int) -> int:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *a: stop.append(1))
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t", "gpu_pct", "mem_pct", "used_bytes", "procs"])
        while not stop:
            t = time.time()
            u = pynvml.nvmlDeviceGetUtilizationRates(h)
            used = pynvml.nvmlDeviceGetMemoryInfo(h).used
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            w.writerow([f"{t:.3f}", u.gpu, u.memory, used,
                        ";".join(f"{p.pid}:{p.usedGpuMemory}" for p in procs)])
            f.flush()
            time.sleep(max(0.0, every_ms / 1000 - (time.time() - t)))
    return 0


def read_samples(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            procs = {int(p.split(":")[0]): int(p.split(":")[1]) for p in r["procs"].split(";") if p}
            rows.append({"t": float(r["t"]), "gpu": int(r["gpu_pct"]), "mem": int(r["mem_pct"]),
                         "used": int(r["used_bytes"]), "procs": procs})
    return rows


def arm_spans(sweep: Path) -> list[tuple[str, str, float, float, Optional[float], Optional[float], set[int]]]:
    """(case, arm, begin, end, steps begin, steps end, pids) of every arm that ran."""
    from harness.results.phases import read_arm_phases
    from harness.results.timing import leg_begin, leg_end

    out = []
    for arm_dir in sorted(p for p in sweep.glob("*/*") if p.is_dir()):
        try:
            legs = read_arm_phases(arm_dir)
        except Exception:
            continue
        allegs = [leg for rp in legs.values() for leg in rp.legs]
        begins = [b for b in map(leg_begin, allegs) if b is not None]
        ends = [e for e in map(leg_end, allegs) if e is not None]
        if not begins or not ends:
            continue
        s_begin = [s.recorded_at - (s.step_s or 0.0) for leg in allegs for s in leg.steps
                   if s.recorded_at is not None]
        s_end = [s.written_at for leg in allegs for s in leg.steps if s.written_at is not None]
        pids = {leg.pid for leg in allegs if getattr(leg, "pid", None) is not None}
        out.append((arm_dir.parent.name, arm_dir.name, min(begins), max(ends),
                    min(s_begin, default=None), max(s_end, default=None), pids))
    return out


def arms(sweeps: Sequence[Path], samples_csv: Path, json_out: Optional[Path]) -> int:
    samples = read_samples(samples_csv)
    lines = ["| case / arm | wall s | GPU % (span) | GPU % (steps) | mem % (steps) | "
             "device used max GiB | samples |", "|---|---|---|---|---|---|---|"]
    result = []
    for sweep in sweeps:
        for case, arm, b, e, sb, se, _ in arm_spans(sweep):
            span = [s for s in samples if b <= s["t"] <= e]
            steps = [s for s in samples if sb is not None and se is not None and sb <= s["t"] <= se]

            def mean(rows: list[dict[str, Any]], key: str) -> Optional[float]:
                return statistics.fmean(r[key] for r in rows) if rows else None

            row = {"sweep": sweep.name, "case": case, "arm": arm, "wall_s": e - b,
                   "gpu_span": mean(span, "gpu"), "gpu_steps": mean(steps, "gpu"),
                   "mem_steps": mean(steps, "mem"),
                   "used_max": max((s["used"] for s in span), default=None), "n": len(span)}
            result.append(row)
            f = lambda v, p=0: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
            lines.append(f"| {case} / {arm} | {row['wall_s']:.1f} | {f(row['gpu_span'])} | "
                         f"{f(row['gpu_steps'])} | {f(row['mem_steps'])} | "
                         f"{f(row['used_max'] and row['used_max'] / 2**30, 1)} | {len(span)} |")
    print("\n".join(lines))
    rest = [s["used"] - sum(s["procs"].values()) for s in samples if s["procs"]]
    idle = [s["used"] for s in samples if not s["procs"]]
    if rest:
        print(f"\nNVML used - sum of processes over {len(rest)} samples with processes: "
              f"min {min(rest) / MIB:.1f} MiB, max {max(rest) / MIB:.1f} MiB, distinct "
              f"{len(set(rest))}; used with no process: {sorted(set(i / MIB for i in idle))[:5]} MiB")
    busy = [s["gpu"] for s in samples]
    if busy:
        print(f"whole run: {len(samples)} samples over {samples[-1]['t'] - samples[0]['t']:.0f} s, "
              f"mean GPU {statistics.fmean(busy):.0f} %, samples at 0 %: "
              f"{sum(1 for x in busy if x == 0) / len(busy):.0%}")
    if json_out:
        json_out.write_text(json.dumps({"arms": result, "driver_rest": sorted(set(rest))}, indent=1))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("sample")
    s.add_argument("out", type=Path)
    s.add_argument("--every-ms", type=int, default=200)
    a = sub.add_parser("arms")
    a.add_argument("paths", type=Path, nargs="+", help="SWEEP [SWEEP ...] SAMPLES.csv")
    a.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.verb == "sample":
        return sample(args.out, args.every_ms)
    return arms(args.paths[:-1], args.paths[-1], args.json)


if __name__ == "__main__":
    sys.exit(main())
