"""Predicted vs measured memory on a GPU (issue 42): run cases through the harness, then put
each CUDA rank's recorded prediction (``memory_predicted``) beside what it measured.

    python3 bench/memory_gpu.py --run OUT CASE[:STEPS[:COMPARE,...[:K]]] ...   # run, then the table
    python3 bench/memory_gpu.py SWEEP ...                                  # the table of sweeps

``--run`` writes a copy of each case file with ``train.steps`` set to STEPS and only the
``compare`` entries named (fewer arms, so a device call holds them), runs ``python3 -m harness run``
on it into ``OUT/<case>`` (with ``-k K`` when given), and prints the table of every sweep. Table: per case, arm and rank the
graph pool, arenas and peak allocated, predicted / measured, and Megatron's estimate; ``--json``
writes the rows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.results import read_steps  # noqa: E402

MIB = 2**20


def reduced_case(spec: str, out: Path) -> Path:
    """A copy of ``CASE[:STEPS[:COMPARE,...]]`` with fewer steps and comparisons, in ``out``."""
    path, *rest = spec.split(":")
    doc = yaml.safe_load(Path(path).read_text())
    if rest and rest[0]:
        doc["train"]["steps"] = int(rest[0])
        if "memory_probe_step" in doc["train"]:
            doc["train"]["memory_probe_step"] = min(doc["train"]["memory_probe_step"], int(rest[0]))
    if len(rest) > 1:
        keep = set(rest[1].split(","))
        doc["compare"] = {k: v for k, v in (doc.get("compare") or {}).items() if k in keep}
    dst = out / Path(path).name
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dst


def rows_of(sweep: Path) -> list[dict]:
    rows = []
    for arm_dir in sorted(p for p in sweep.glob("*/*") if any(p.glob("rank*.jsonl"))):
        for rank, recs in sorted(read_steps(arm_dir).items()):
            pred = next((r.memory_predicted for r in recs if r.memory_predicted is not None), None)
            stats = [r.graph_stats for r in recs if r.graph_stats is not None]
            peaks = [r.max_allocated_bytes for r in recs if r.max_allocated_bytes]
            row = {"case": arm_dir.parent.name, "arm": arm_dir.name, "rank": rank,
                   "pool_mib": stats[-1].pool_reserved_bytes / MIB if stats else None,
                   "arenas_mib": stats[-1].arena_bytes / MIB if stats else None,
                   "peak_mib": max(peaks) / MIB if peaks else None, "predicted": None}
            if pred is not None:
                row["predicted"] = {"pool_mib": None if pred.pool_bytes is None else pred.pool_bytes / MIB,
                                    "arenas_mib": None if pred.arena_bytes is None else pred.arena_bytes / MIB,
                                    "peak_mib": pred.peak_bytes / MIB, "megatron_mib": pred.megatron_bytes / MIB}
            rows.append(row)
    return rows


def _cell(pred, meas) -> str:
    if pred is None or meas is None:
        return "-"
    return f"{pred:,.0f} / {meas:,.0f} = **{pred / meas:.4f}**"


def table(rows: list[dict]) -> str:
    out = ["| case | arm | rank | graph pool MiB pred / meas | arenas MiB pred / meas | peak allocated MiB "
           "pred / meas | Megatron MiB (/ peak) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["predicted"] or {}
        meg = p.get("megatron_mib")
        megc = f"{meg:,.0f} ({meg / r['peak_mib']:.3f})" if meg and r["peak_mib"] else "-"
        out.append(f"| {r['case']} | {r['arm']} | {r['rank']} | {_cell(p.get('pool_mib'), r['pool_mib'])} | "
                   f"{_cell(p.get('arenas_mib'), r['arenas_mib'])} | {_cell(p.get('peak_mib'), r['peak_mib'])} | "
                   f"{megc} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("items", nargs="+", help="sweep folders, or with --run CASE[:STEPS[:COMPARE,...]]")
    ap.add_argument("--run", type=Path, default=None, metavar="OUT", help="run the cases into OUT first")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sweeps = []
    if args.run is not None:
        args.run.mkdir(parents=True, exist_ok=True)
        for spec in args.items:
            case = reduced_case(spec, args.run)
            sweep = args.run / case.stem
            print(f"== {case.stem}", flush=True)
            k = spec.split(":")[3:4]
            subprocess.run([sys.executable, "-m", "harness", "run", str(case), "--out", str(sweep)]
                           + (["-k", k[0]] if k else []), cwd=ROOT, check=False)
            sweeps.append(sweep)
            rows = [r for s in sweeps for r in rows_of(s)]
            print(table(rows), flush=True)
            if args.json:  # after every case: a call cut short keeps what it measured
                args.json.write_text(json.dumps(rows, indent=1))
    else:
        sweeps = [Path(s) for s in args.items]
    rows = [r for s in sweeps for r in rows_of(s)]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
