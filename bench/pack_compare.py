"""A packed sweep against a serial one of the same cases (issue 50): the same verdicts, losses
bitwise, every memory figure side by side.

    python bench/pack_compare.py SERIAL PACKED [--md OUT.md]

Per case: its arms' wall time in each sweep (first arm started to last arm ended, from
``placement.json``; the sum of the arms' outcome wall times where a sweep has none), whether
every verdict entry has the same status and every check the same pass / fail, whether every
arm's losses (and aux losses, grad norms) are bitwise equal on every rank and step, and the
memory figures of both (the memory probe's ``device_used_bytes`` and ``others_bytes``, the
largest ``max_allocated_bytes`` and ``reserved_bytes`` of any step, the graph pool), with the
largest difference. Exit 1 when a verdict or a loss differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

MIB = 2**20


def records(arm_dir: Path) -> dict[int, list[dict[str, Any]]]:
    out = {}
    for f in sorted(arm_dir.glob("rank*.jsonl")):
        rank = int(f.stem[4:])
        out[rank] = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def verdict(case_dir: Path) -> Optional[dict[str, Any]]:
    f = case_dir / "verdict.json"
    return json.loads(f.read_text()) if f.is_file() else None


def statuses(v: Optional[dict[str, Any]]) -> Any:
    if v is None:
        return None
    return sorted((p["pair"], tuple(p["arms"]), p["status"],
                   tuple(sorted((c["name"], c["passed"], c["applicable"]) for c in p["checks"])))
                  for p in v["pairs"])


def case_wall(sweep: Path, case: str) -> Optional[float]:
    f = sweep / "placement.json"
    if f.is_file():
        arms = [a for a in json.loads(f.read_text())["arms"] if a["case_id"] == case]
        if arms:
            return max(a["ended_at"] for a in arms) - min(a["started_at"] for a in arms)
    total = 0.0
    for o in (sweep / case).glob("*/outcome.json"):
        total += json.loads(o.read_text()).get("wall_s") or 0.0
    return total or None


def memory(recs: dict[int, list[dict[str, Any]]]) -> dict[str, Optional[int]]:
    probe = [r["memory_probe"] for rs in recs.values() for r in rs if r.get("memory_probe")]
    pools = [r["graph_stats"].get("pool_reserved_bytes") for rs in recs.values() for r in rs
             if r.get("graph_stats")]

    def top(key: str) -> Optional[int]:
        vals = [r.get(key) for rs in recs.values() for r in rs if r.get(key) is not None]
        return max(vals) if vals else None

    return {"device_used": max((p["device_used_bytes"] for p in probe), default=None),
            "others": max((p.get("others_bytes") or 0 for p in probe), default=None),
            "max_allocated": top("max_allocated_bytes"), "reserved": top("reserved_bytes"),
            "pool": max((p for p in pools if p is not None), default=None)}


def mib(v: Optional[int]) -> str:
    return "-" if v is None else f"{v / MIB:,.0f}"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("serial", type=Path)
    ap.add_argument("packed", type=Path)
    ap.add_argument("--md", type=Path, default=None)
    args = ap.parse_args(argv)
    cases = sorted(p.name for p in args.serial.iterdir() if (p / "plan.json").is_file())
    lines = ["| case | serial s | packed s | verdicts equal | losses bitwise | arms | "
             "device used MiB (serial / packed) | NVML others MiB (packed) | max allocated MiB | "
             "reserved MiB | graph pool MiB |", "|" + "---|" * 11]
    bad = 0
    rows = []
    for case in cases:
        s_dir, p_dir = args.serial / case, args.packed / case
        if not p_dir.is_dir():
            lines.append(f"| {case} | - | not in the packed sweep | | | | | | | | |")
            continue
        if verdict(s_dir) is None:  # the serial run was stopped before this case was judged
            lines.append(f"| {case} | not finished | {case_wall(args.packed, case) or 0:.1f} | | | | | | | | |")
            continue
        same_verdict = statuses(verdict(s_dir)) == statuses(verdict(p_dir))
        loss_equal, arms, mem = True, 0, []
        for arm_dir in sorted(d for d in s_dir.iterdir() if d.is_dir()):
            a, b = records(arm_dir), records(p_dir / arm_dir.name)
            if not a:
                continue
            arms += 1
            for rank in a:
                for ra, rb in zip(a[rank], b.get(rank, [])):
                    for key in ("loss", "aux_loss", "grad_norm"):
                        if ra.get(key) != rb.get(key):
                            loss_equal = False
                if len(a[rank]) != len(b.get(rank, [])):
                    loss_equal = False
            mem.append((arm_dir.name, memory(a), memory(b)))
        bad += (not same_verdict) + (not loss_equal)

        def pair(key: str) -> str:
            vals = [(x[key], y[key]) for _, x, y in mem if x[key] is not None or y[key] is not None]
            if not vals:
                return "-"
            worst = max(vals, key=lambda v: abs((v[1] or 0) - (v[0] or 0)))
            diff = (worst[1] or 0) - (worst[0] or 0)
            return f"{mib(worst[0])} / {mib(worst[1])} ({diff / MIB:+,.1f})"

        others = max((y["others"] or 0 for _, _, y in mem), default=0)
        sw, pw = case_wall(args.serial, case), case_wall(args.packed, case)
        lines.append(f"| {case} | {sw and f'{sw:.1f}'} | {pw and f'{pw:.1f}'} | "
                     f"{'yes' if same_verdict else 'NO'} | {'yes' if loss_equal else 'NO'} | {arms} | "
                     f"{pair('device_used')} | {mib(others)} | {pair('max_allocated')} | "
                     f"{pair('reserved')} | {pair('pool')} |")
        rows.append({"case": case, "verdicts_equal": same_verdict, "losses_bitwise": loss_equal,
                     "memory": mem})
    text = "\n".join(lines) + (f"\n\n{bad} difference(s) in verdicts or losses\n")
    print(text)
    if args.md:
        args.md.write_text(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
