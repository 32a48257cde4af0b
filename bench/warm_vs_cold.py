"""Warm and cold rank processes side by side: the same cases run twice through the CLI, once with
every rank started afresh (``run --cold-start``) and once forked from the warm servers
(``harness.launch.ranks.warm``); then every step record of every arm is compared field by field, the
timings aside (fields ending ``_s`` or ``_at``), and the verdicts entry by entry.

Run from the repository root::

    python bench/warm_vs_cold.py cases/focused [-k EXPR] --out DIR [--json OUT.json]

``DIR/cold`` and ``DIR/warm`` are the two sweeps (resumed when they exist). Prints one row per arm
(records equal or the first field that differs, wall time cold and warm) and the two runs' wall
times; exits 1 when any record or verdict status differs, 2 when a run could not be compared (a
sweep without records). What a warm start may change is the time to the first step only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from harness.results import read_outcome, read_steps  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def without_timings(value: Any) -> Any:
    """``value`` (records, dataclasses, dicts, lists) with every field named ``*_s`` or ``*_at``
    left out, at any depth: what a warm start may change."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items()
                if not (isinstance(k, str) and (k.endswith("_s") or k.endswith("_at")))}
    if isinstance(value, (list, tuple)):
        return [without_timings(v) for v in value]
    return value


def first_difference(a: Any, b: Any, path: str = "") -> Optional[str]:
    """The path of the first field where ``a`` and ``b`` differ (None: equal). NaN equals NaN."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{path}.{key}".lstrip(".")
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path} (length {len(a)} vs {len(b)})".lstrip(".")
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    same = a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)
    return None if same else (path.lstrip(".") or "value")


def run_sweep(paths: Sequence[str], k: Optional[str], out: Path, cold: bool) -> float:
    """Run ``dcp-harness run`` into ``out``; its wall time (its exit code is the gate's: ignored
    here, the verdicts are compared instead)."""
    argv = [sys.executable, "-m", "harness", "run", *paths, "--out", str(out)]
    argv += ["-k", k] if k else []
    argv += ["--cold-start"] if cold else []
    started = time.monotonic()
    subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, check=False)
    return time.monotonic() - started


def compare_sweeps(cold: Path, warm: Path) -> list[dict[str, Any]]:
    """One row per arm that holds records in either sweep."""
    rows = []
    arms = sorted({p.parent.relative_to(root) for root in (cold, warm)
                   for p in root.glob("*/*/rank*.jsonl")})
    for arm in arms:
        a, b = read_steps(cold / arm), read_steps(warm / arm)
        diff = first_difference(without_timings(a), without_timings(b))
        walls = [read_outcome(root / arm) for root in (cold, warm)]
        rows.append({"arm": str(arm), "equal": diff is None, "first_difference": diff,
                     "steps": sum(len(r) for r in a.values()),
                     "wall_cold_s": walls[0].wall_s if walls[0] else None,
                     "wall_warm_s": walls[1].wall_s if walls[1] else None})
    return rows


def verdict_statuses(sweep: Path) -> dict[str, list[str]]:
    out = {}
    for path in sorted(sweep.glob("*/verdict.json")):
        data = json.loads(path.read_text())
        out[path.parent.name] = [f"{p['pair']}:{p['status']}" for p in data["pairs"]]
    return out


def table(rows: list[dict[str, Any]], walls: dict[str, float]) -> str:
    lines = ["| arm | steps | records (timings aside) | wall cold (s) | wall warm (s) |",
             "|---|---|---|---|---|"]
    for r in rows:
        what = "equal" if r["equal"] else f"DIFFER at {r['first_difference']}"
        cold = "-" if r["wall_cold_s"] is None else f"{r['wall_cold_s']:.1f}"
        warm = "-" if r["wall_warm_s"] is None else f"{r['wall_warm_s']:.1f}"
        lines.append(f"| {r['arm']} | {r['steps']} | {what} | {cold} | {warm} |")
    lines.append("")
    lines.append(f"`run` wall: cold {walls['cold']:.1f} s, warm {walls['warm']:.1f} s "
                 f"(warm / cold {walls['warm'] / walls['cold']:.2f})" if walls else "")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/warm_vs_cold.py", description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("-k", default=None, metavar="EXPR")
    p.add_argument("--out", required=True, type=Path, metavar="DIR")
    p.add_argument("--json", type=Path, default=None, metavar="OUT.json")
    args = p.parse_args(argv)
    walls = {name: run_sweep(args.paths, args.k, args.out / name, name == "cold")
             for name in ("cold", "warm")}
    rows = compare_sweeps(args.out / "cold", args.out / "warm")
    statuses = [verdict_statuses(args.out / name) for name in ("cold", "warm")]
    print(table(rows, walls))
    same_verdicts = statuses[0] == statuses[1]
    print(f"verdicts: {'the same' if same_verdicts else 'DIFFER'} "
          f"({sum(len(v) for v in statuses[0].values())} entries)")
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "walls": walls, "verdicts": statuses},
                                        indent=2))
    if not rows:
        print("no arm holds records in either sweep: nothing was compared", file=sys.stderr)
        return 2
    return 0 if same_verdicts and all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
