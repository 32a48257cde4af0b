"""Train GPU cases through `dcp-harness run` and print step time and memory per rank and arm.

    python bench/workload_gpu.py CASES... [--out DIR] [-k EXPR]

Runs the cases exactly as users do (local launcher, one process per GPU, NCCL), then reads the
per-rank step records: median step time over steps after the first two (warm-up), peak allocated
and reserved bytes, final loss, NaN/skipped steps, and the CP sizes the ranks ran. Exit code is the
gate's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from rich.table import Table

from harness.cli import main as harness_main
from harness.report import make_console
from harness.results import read_outcome, read_steps

GIB = 1024**3


def _peak(recs: list, key: str) -> int | None:
    values = [getattr(r, key) for r in recs if getattr(r, key) is not None]
    return max(values) if values else None  # null without CUDA


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def arm_rows(case_dir: Path) -> list[list[str]]:
    rows = []
    for arm_dir in sorted(p for p in case_dir.iterdir() if (p / "outcome.json").is_file()):
        outcome = read_outcome(arm_dir)
        for rank, recs in sorted(read_steps(arm_dir).items()):
            timed = [r for r in recs if r.graphed] or recs[2:] or recs
            times = [r.step_time_s for r in timed]
            alloc = _peak(recs, "max_allocated_bytes")
            reserved = _peak(recs, "reserved_bytes")
            cps = sorted({c for r in recs for c in r.cp_sizes})
            rows.append([
                case_dir.name, arm_dir.name, str(rank), outcome.status, str(len(recs)),
                f"{recs[-1].loss:.4f}" if recs else "-",
                str(sum(bool(r.nan) or bool(r.skipped) for r in recs)),
                f"{1000 * statistics.median(times):.1f}" if times else "-",
                _gib(alloc), _gib(reserved), ",".join(map(str, cps)),
                str(recs[-1].device or "-") if recs else "-",
            ])
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+")
    parser.add_argument("--out", type=Path, default=Path("results") / "workload-gpu")
    parser.add_argument("-k", dest="k", default=None)
    args = parser.parse_args(argv)
    run_args = ["run", *args.cases, "--out", str(args.out)] + (["-k", args.k] if args.k else [])
    code = harness_main(run_args)
    if not args.out.is_dir():  # a config error (already printed) wrote nothing
        return code
    table = Table(title="workload on GPU: per rank and arm (step time = median after 2 warm-up steps)")
    for col in ("case", "arm", "rank", "outcome", "steps", "final loss", "nan/skipped",
                "step ms", "peak alloc GiB", "peak reserved GiB", "CP sizes", "device"):
        table.add_column(col)
    for case_dir in sorted(p for p in args.out.iterdir() if (p / "case.json").is_file()):
        for row in arm_rows(case_dir):
            table.add_row(*row)
    make_console().print(table)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
