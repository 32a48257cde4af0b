"""What a graph pool holds, block by block, and what flash attention's backward allocates inside
its op (issue 42: the pool's transient term), on one GPU.

    python3 bench/pool_snapshot.py OUT [--budget-s 240] [--only NAME,...]

1. ``flash``: one flash varlen forward and backward of the focused cases' attention shapes
   (Qwen3-30B-A3B heads, the static layout's ``max_seqs + 2`` offsets), deterministic as the cases
   run, with the caching allocator's history on: every allocation inside the backward op with its
   size (``OUT/flash.json.gz``), beside the device's SM count and the cuBLAS workspace setting.
2. One graph arm per entry of :data:`RUNS` (an arm of a case file, its rank alone on the device
   through ``emulate_rank``, as an emulated rank of a larger world, 3 steps:
   2 eager then capture): the allocator's history around ``capture_plan`` and, right after it, the
   pool's segments and blocks (``OUT/<name>.json.gz``: segments with their type and blocks,
   every trace event in the pool's address ranges, the arm's own graph_stats).

Entries run in order and stop starting new ones after ``--budget-s`` seconds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# name: (case file, matrix id part or None, arm, rank)
RUNS = {
    "qwen3-attn-graph": ("cases/focused/gpu1-qwen3-graphs.yaml", "scope-attn", "graph", 0),
    "emu-graph-r3": ("cases/focused/gpu1-emulated-dcp12-pp2-vpp2-ep2-graphs.yaml", None, "graph", 3),
    "emu-fixedcp2-r3": ("cases/focused/gpu1-emulated-dcp12-pp2-vpp2-ep2-graphs.yaml", None, "graph-fixed-cp2", 3),
    "emu-graph-r0": ("cases/focused/gpu1-emulated-dcp12-pp2-vpp2-ep2-graphs.yaml", None, "graph", 0),
    "emu-separate-r3": ("cases/focused/gpu1-emulated-dcp12-pp2-vpp2-ep2-graphs.yaml", None, "graph-separate-pools", 3),
    "head16-graph-r7": ("cases/emulated/gb200-qwen3-30b-a3b-dcp-graphs-emulated-16l.yaml", None, "graph", 7),
}
MIB = 2**20


def _frames(fr: list[dict], n: int = 10) -> list[str]:
    out = []
    for f in fr:
        name = f.get("filename", "")
        if "/torch/" in name and "autograd" not in name and "attention" not in name:
            continue
        out.append(f"{name.split('site-packages/')[-1].split('.device-carry/memplan/')[-1]}:{f.get('line')}:{f.get('name')}")
        if len(out) >= n:
            break
    return out


def _write(path: Path, doc: dict) -> None:
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)


def _trace(snap: dict, keep) -> list[dict]:  # noqa: ANN001
    events = []
    for dev in snap.get("device_traces", []):
        for e in dev:
            if keep(e):
                events.append({"action": e["action"], "addr": e.get("addr"), "size": e.get("size"),
                               "stream": e.get("stream"), "frames": _frames(e.get("frames", []))})
    return events


def flash(out: Path) -> None:
    import torch
    from torch.nn.attention.varlen import varlen_attn

    torch.use_deterministic_algorithms(True)
    dev = torch.device("cuda")
    t, h, kv, d, seqs = 4096, 32, 4, 128, 16
    cu = torch.tensor([0] + [256 * (i + 1) for i in range(seqs)] + [t], dtype=torch.int32, device=dev)
    res = {"sms": torch.cuda.get_device_properties(0).multi_processor_count,
           "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
           "torch": torch.__version__, "device": torch.cuda.get_device_name(0), "calls": []}
    for heads_k in (h, kv):
        q = torch.randn(t, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(t, heads_k, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(t, heads_k, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        extra = {"enable_gqa": True} if heads_k != h else {}
        try:
            o = varlen_attn(q, k, v, cu, cu, t, t, window_size=(-1, 0), **extra)
        except TypeError as e:
            res["calls"].append({"heads_k": heads_k, "error": str(e)})
            continue
        g = torch.randn_like(o)
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=100000)
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), g)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(None)
        res["calls"].append({"heads_k": heads_k, "total_q": t, "batch": seqs + 1, "peak_over_base": peak,
                             "events": _trace(snap, lambda e: e["action"] in ("alloc", "free_completed"))})
        del o, g, dq, dk, dv, q, k, v
    _write(out / "flash.json.gz", res)
    print(f"flash: {len(res['calls'])} calls, sms {res['sms']}", flush=True)


def _case(path: str, part: str | None, tmp: Path):
    from harness.spec.loader import load_cases

    doc = yaml.safe_load((ROOT / path).read_text())
    doc["train"]["steps"] = 3
    if "memory_probe_step" in doc["train"]:
        doc["train"]["memory_probe_step"] = 3
    keep = ("graph_vs_eager", "dcp_vs_fixed_cp", "graph_pools")  # the comparisons of the graph arms
    doc["compare"] = {k: v for k, v in doc.get("compare", {}).items() if k in keep}
    f = tmp / Path(path).name
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return next(c for c in load_cases(f) if part is None or part in c.id)


def arm_run(name: str, out: Path, tmp: Path) -> None:
    import torch

    import harness.slotmem as slotmem
    from harness.arms import plan_case
    from harness.spec.derive import as_emulated
    from harness.workload.emulate import WeightCache, emulate_rank

    path, part, arm_name, rank = RUNS[name]
    case = _case(path, part, tmp)
    if case.emulate is None and case.layout.world > 1:
        case = as_emulated(case, [rank])
    arm = next(a for a in plan_case(case).arms if a.name == arm_name)
    run_case = arm.case
    original = slotmem.capture_plan
    pools: list[dict] = []

    def capture_plan(*args, **kwargs):  # noqa: ANN002, ANN003
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=2_000_000)
        g = original(*args, **kwargs)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(None)
        segs = [s for s in snap["segments"] if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0)]
        ranges = [(s["address"], s["address"] + s["total_size"]) for s in segs]
        inside = lambda e: any(a <= (e.get("addr") or -1) < b for a, b in ranges)  # noqa: E731
        pools.append({
            "segments": [{"pool": list(s["segment_pool_id"]), "address": s["address"],
                          "total_size": s["total_size"], "segment_type": s.get("segment_type"),
                          "stream": s.get("stream"),
                          "blocks": [{"size": b["size"], "requested_size": b.get("requested_size"),
                                      "state": b["state"], "frames": _frames(b.get("frames", []), 6)}
                                     for b in s["blocks"]]} for s in segs],
            "trace": _trace(snap, inside), "memory": repr(g.memory())})
        return g

    slotmem.capture_plan = capture_plan
    records = []
    t0 = time.time()
    try:
        emulate_rank(run_case, rank, records.append, weights=WeightCache(threads=16))
    finally:
        slotmem.capture_plan = original
    stats = [r.graph_stats for r in records if r.graph_stats is not None]
    doc = {"name": name, "case": run_case.id, "arm": arm_name, "rank": rank, "seconds": time.time() - t0,
           "graph_stats": None if not stats else {"pool_reserved_bytes": stats[-1].pool_reserved_bytes,
                                                  "arena_bytes": stats[-1].arena_bytes},
           "peak_allocated_bytes": max((r.max_allocated_bytes or 0) for r in records),
           "captures": pools}
    _write(out / f"{name}.json.gz", doc)
    gs = doc["graph_stats"] or {}
    print(f"{name}: pool {gs.get('pool_reserved_bytes', 0) / MIB:,.1f} MiB, arenas "
          f"{gs.get('arena_bytes', 0) / MIB:,.1f} MiB, {sum(len(p['segments']) for p in pools)} segments, "
          f"{doc['seconds']:.0f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--only", default=None, help="names of RUNS (and 'flash'), comma separated")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    only = None if args.only is None else set(args.only.split(","))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    t0 = time.time()
    if only is None or "flash" in only:
        flash(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        for name in RUNS:
            if only is not None and name not in only:
                continue
            if time.time() - t0 > args.budget_s:
                print(f"{name}: not started (budget {args.budget_s:.0f} s spent)", flush=True)
                continue
            try:
                arm_run(name, args.out, Path(tmp))
            except Exception as e:  # noqa: BLE001 - the next entry still runs
                print(f"{name}: failed: {type(e).__name__}: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
