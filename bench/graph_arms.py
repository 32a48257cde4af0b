"""Graph arms on this machine's GPUs: run graph cases (and the eager baseline of the same shape)
through `dcp-harness run`, then print one table of every arm from that one run: step time
(median over the graph-replaying steps of a graph arm, over steps after the first otherwise),
peak allocated / reserved, graph pool and arena bytes, capture and warmup peaks, capture time, and
the ratios graph / eager (and eager static-shape path / today's eager path).

    python bench/graph_arms.py [CASE PATHS...] [-k EXPR] [--out DIR]

Default: cases/focused/gpu1-qwen3-graphs.yaml (scopes attn and full) and
cases/gpu/gpu1-qwen3-eager.yaml (today's dynamic-shape eager path, same shape).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.results import list_arm_dirs, read_outcome, read_steps  # noqa: E402

GIB = 2.0 ** 30
MIB = 2.0 ** 20


def arm_row(case_id: str, arm: str, arm_dir: Path) -> Optional[dict]:
    outcome = read_outcome(arm_dir)
    steps = read_steps(arm_dir)
    if not steps:
        return {"case": case_id, "arm": arm, "status": outcome.describe() if outcome else "no results"}
    recs = [r for rank in sorted(steps) for r in steps[rank]]
    graphed = [r for r in recs if r.graphed]
    timed = graphed or [r for r in recs if r.step > 1]
    per_step: dict[int, float] = {}
    for r in timed:
        if r.step_time_s is not None:
            per_step[r.step] = max(per_step.get(r.step, 0.0), r.step_time_s)
    stats = [r.graph_stats for r in recs if r.graph_stats is not None]
    probe = [r.memory_probe for r in recs if r.memory_probe is not None]
    row = {
        "case": case_id, "arm": arm, "status": outcome.status if outcome else "?",
        "steps": max(r.step for r in recs),
        "step_ms": statistics.median(per_step.values()) * 1e3 if per_step else None,
        "peak_alloc_gib": max((r.max_allocated_bytes or 0) for r in recs) / GIB,
        "reserved_gib": max((r.reserved_bytes or 0) for r in recs) / GIB,
        "final_loss": recs[-1].loss,
    }
    if probe:
        row["device_used_gib"] = max(p.device_used_bytes for p in probe) / GIB
    if stats:
        s = max(stats, key=lambda s: s.pool_reserved_bytes)
        row.update(pool_mib=s.pool_reserved_bytes / MIB, arena_mib=s.arena_bytes / MIB,
                   capture_s=s.capture_s, warmup_s=s.warmup_s,
                   capture_peak_gib=s.capture_peak_bytes / GIB, warmup_peak_gib=s.warmup_peak_bytes / GIB,
                   summary=s.summary)
    return row


def fmt(v: object, spec: str = ".1f") -> str:
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, float) else str(v)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", default=["cases/focused/gpu1-qwen3-graphs.yaml",
                                                 "cases/gpu/gpu1-qwen3-eager.yaml"])
    p.add_argument("-k", default=None)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="graph-arms-")) / "sweep"
    cmd = [sys.executable, "-c", "import sys; from harness.cli import main; sys.exit(main())",
           "run", *args.paths, "--out", str(out)] + (["-k", args.k] if args.k else [])
    print("$", " ".join(cmd[3:]), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT)
    rows = []
    for case_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        for arm, arm_dir in list_arm_dirs(case_dir).items():
            row = arm_row(case_dir.name, arm, arm_dir)
            if row:
                rows.append(row)
    cols = [("case", "s"), ("arm", "s"), ("status", "s"), ("steps", "d"), ("step_ms", ".1f"),
            ("peak_alloc_gib", ".2f"), ("reserved_gib", ".2f"), ("device_used_gib", ".2f"),
            ("pool_mib", ".0f"), ("arena_mib", ".0f"), ("capture_s", ".2f"), ("warmup_s", ".2f"),
            ("capture_peak_gib", ".2f"), ("warmup_peak_gib", ".2f"), ("final_loss", ".6f")]
    print("\n| " + " | ".join(c for c, _ in cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(fmt(r.get(c), s) if s != "d" else fmt(r.get(c)) for c, s in cols) + " |")
    by = {(r["case"], r["arm"]): r for r in rows}
    print()
    eager_today = next((r for r in rows if r["case"].startswith("gpu1-qwen3-eager")), None)
    for (case, arm), r in sorted(by.items()):
        if arm == "graph":
            e = by.get((case, "eager")) or by.get((case, "dcp"))
            if e and r.get("step_ms") and e.get("step_ms"):
                print(f"{case}: graph / eager step time = {r['step_ms']:.1f} / {e['step_ms']:.1f} ms "
                      f"= {r['step_ms'] / e['step_ms']:.3f}")
            if r.get("summary"):
                print(f"{case}: capture line: {r['summary']}")
        if arm in ("eager", "dcp") and eager_today and eager_today is not r and r.get("step_ms") \
                and eager_today.get("step_ms") and not case.startswith("gpu1-qwen3-eager"):
            print(f"{case}: eager static-shape path / today's eager path = {r['step_ms']:.1f} / "
                  f"{eager_today['step_ms']:.1f} ms = {r['step_ms'] / eager_today['step_ms']:.3f}")
    print(f"\nresults: {out}  (dcp-harness run exit {rc})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
