"""The memory plan against measurement (issue 42), on the CPU.

    python bench/memory_plan.py [--json FILE]

1. Times ``harness.memplan.predict_case`` on the headline regression case
   (``cases/regression/gb200-qwen3-30b-a3b-dcp-graphs.yaml``: PP4 x VPP4 x EP2 x DCP {1, 2}, seq
   8192, 48 layers), every rank (target < 10 s).
2. Prints predicted vs measured for the emulated headline ranks 0 and 7 (16 layers: the
   measured figures of bench/RESULTS-log.md, "Call 3: the emulated headline in training", one H200,
   torch 2.11, whose flash varlen repeats K/V heads: the plan is made for that target), with
   Megatron's estimate beside both.
3. Prints each measured arm of :data:`ARMS` (bench/RESULTS-log.md, "the memory plan", the H100 table:
   graph pool, arenas, peak allocated) beside its own arm's prediction (``arm_figures`` of the
   arm's derived case, torch 2.11's attention path).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.memplan.predict import predict_case  # noqa: E402
from harness.memplan.records import MIB, MemoryTarget  # noqa: E402
from harness.spec.loader import load_cases  # noqa: E402

HEADLINE = ROOT / "cases/regression/gb200-qwen3-30b-a3b-dcp-graphs.yaml"
EMULATED = ROOT / "cases/emulated/gb200-qwen3-30b-a3b-dcp-graphs-emulated-16l.yaml"
FOCUSED_EMULATED = ROOT / "cases/focused/gpu1-emulated-dcp12-pp2-vpp2-ep2-graphs.yaml"
QWEN3 = ROOT / "cases/focused/gpu1-qwen3-graphs.yaml"
# bench/RESULTS-log.md, "Call 3: the emulated headline in training" (2026-12-01, one H200, torch
# 2.11.0+cu130): graph pool, arenas, separate pools (= ratio x largest variant), peak allocated
MEASURED = {
    0: {"pool": 13794, "arenas": 13115, "separate": round(13794 / 1.0023 * 1.6929), "peak": 59937},
    7: {"pool": 9684, "arenas": 9004, "separate": round(9684 / 1.0033 * 1.7014), "peak": 59544},
}


# (case file, matrix id part, arm, rank): measured (pool, arenas, peak) MiB, one H100, torch 2.11
ARMS = {
    (EMULATED, None, "graph", 0): (13794, 13115, 59936),
    (EMULATED, None, "graph", 7): (9684, 9004, 59548),
    (EMULATED, None, "graph-separate-pools", 0): (23298, 21973, 68794),
    (EMULATED, None, "graph-separate-pools", 7): (16422, 15095, 65636),
    (EMULATED, None, "dcp", 0): (None, None, 59471),
    (EMULATED, None, "dcp", 7): (None, None, 58733),
    (FOCUSED_EMULATED, None, "graph", 0): (2536, 2212, 13520),
    (FOCUSED_EMULATED, None, "graph", 3): (1816, 1490, 13920),
    (FOCUSED_EMULATED, None, "graph-fixed-cp2", 3): (1864, 1490, 13718),
    (FOCUSED_EMULATED, None, "graph-separate-pools", 3): (3232, 2533, 14962),
    (FOCUSED_EMULATED, None, "dcp", 0): (None, None, 11308),
    (QWEN3, "scope-attn", "graph", 0): (2716, 2004, 27691),
    (QWEN3, "scope-attn", "eager", 0): (None, None, 27532),
    (QWEN3, "scope-full", "graph", 0): (6078, 4697.9, 27787),
    (QWEN3, "scope-full", "eager", 0): (None, None, 27532),
}


def arm_rows() -> list[dict]:
    """Each arm of :data:`ARMS`: its own prediction beside what it measured."""
    from harness.arms import plan_case
    from harness.memplan.arm import arm_figures

    rows = []
    print("\n| case | arm | rank | pool | arenas | peak |")
    print("|---|---|---|---|---|---|")
    for (path, part, arm, rank), measured in ARMS.items():
        case = next(c for c in load_cases(path) if part is None or part in c.id)
        arm_case = next(a.case for a in plan_case(case).arms if a.name == arm)
        r = predict_case(arm_case, MemoryTarget(varlen_native_gqa=False),
                         pp_ranks=[arm_case.layout.pp_rank(rank)]).ranks[0]
        f = arm_figures(arm_case, r)
        cells = []
        for p, m in zip((f.pool_bytes, f.arena_bytes, f.peak_bytes), measured):
            cells.append("-" if p is None or m is None else f"{p / MIB:,.0f} / {m:,} = {p / MIB / m:.3f}")
        print(f"| {case.id} | {arm} | {rank} | " + " | ".join(cells) + " |")
        rows.append({"case": case.id, "arm": arm, "rank": rank, "measured_mib": measured,
                     "predicted_mib": [None if x is None else x / MIB
                                       for x in (f.pool_bytes, f.arena_bytes, f.peak_bytes)]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    out: dict = {}
    (case,) = list(load_cases(HEADLINE))
    t0, c0 = time.perf_counter(), time.process_time()
    cm = predict_case(case)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    world = sum(len(r.ranks) for r in cm.ranks)
    print(f"headline {case.name}: {world} ranks ({len(cm.ranks)} PP stages) planned in {wall:.2f} s "
          f"wall, {cpu:.2f} s CPU (predict_case, after imports; load {os.getloadavg()[0]:.1f})")
    for r in cm.ranks:
        print(f"  stage {r.pp_rank}: pool {r.pool_shared_bytes / MIB:,.0f} MiB, arenas {r.arena_bytes / MIB:,.0f}, "
              f"separate {r.pool_separate_bytes / MIB:,.0f}, peak {r.peak_bytes / MIB:,.0f}, "
              f"Megatron {r.megatron.total_bytes / MIB:,.0f}")
    out["headline_seconds"] = wall
    out["headline_cpu_seconds"] = cpu
    out["headline"] = cm.to_json()
    (emu,) = list(load_cases(EMULATED))
    em = predict_case(emu, MemoryTarget(varlen_native_gqa=False))
    print("\n| rank | figure | predicted MiB | measured MiB | predicted / measured | Megatron MiB |")
    print("|---|---|---|---|---|---|")
    rows = []
    for rank, meas in MEASURED.items():
        r = em.of_rank(rank)
        pred = {"pool": r.pool_shared_bytes, "arenas": r.arena_bytes, "separate": r.pool_separate_bytes,
                "peak": r.peak_bytes}
        for k, m in meas.items():
            p = pred[k] / MIB
            meg = f"{r.megatron.total_bytes / MIB:,.0f}" if k == "peak" else "-"
            print(f"| {rank} | {k} | {p:,.0f} | {m:,} | {p / m:.4f} | {meg} |")
            rows.append({"rank": rank, "figure": k, "predicted_mib": p, "measured_mib": m, "ratio": p / m})
    out["emulated"] = rows
    out["arms"] = arm_rows()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
