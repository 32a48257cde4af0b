"""GPU rows of the mutation table for step time and memory: a seeded 10 % step-time slowdown and a
seeded leak of one extra buffer per microbatch, each against a focused case's golden values
recorded on the same GPU in the same run, before the faulted runs.

Serial by design (a timing row must have the GPU to itself): in a temporary copy of the
repository's files (``bench/mutations.py``'s ``copy_repo`` / ``apply``; no fault flag in
production code), one after another:

1. ``run cases/focused -k CASE`` (clean) and ``golden record --repeats N --into GOLD``: N runs of
   the golden arm in all; the file keeps the per-step median, the spread and the bounds it gives
   (``rtol``); a refusal (too noisy) stops the script with the reason. The clean copy has no
   ``cases/focused/golden/CASE/`` (``without_golden``): the committed golden values, recorded on
   another GPU perhaps, do not judge this run (its golden entry is skipped, with its reason);
2. the clean case again, judged against that golden file: must gate 0 (no false alarm);
3. per fault, a fresh copy with the one-line patch and the golden file: must gate 1, through the
   check the fault is meant to trip (``golden / step_time``, ``golden / mem_*``).

Prints a Markdown table (row, patch, gate exit, failed checks, wall s) and the total time::

    python bench/perf_mutations.py                   # on a CUDA machine, ~3 min on one H200
    python bench/perf_mutations.py --repeats 5 --keep
    python bench/perf_mutations.py --golden-out OUT  # keep the golden file recorded from the repeats
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutations import Mutation, _cli, apply, copy_repo, failed_lines  # noqa: E402

CASE = "gpu1-qwen3-perf"


@dataclass(frozen=True)
class PerfRow:
    mutation: Mutation
    expect: tuple[str, ...]  # check-name prefixes of the golden entry that must fail


ROWS: tuple[PerfRow, ...] = (
    PerfRow(Mutation(
        "step-time-10pct", "harness/workload/train.py",
        "every step sleeps another 10 % of its own time before its clock stops (a 10 % slowdown)",
        "    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0",
        "    time.sleep(0.1 * (time.perf_counter() - t0)); "
        "elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0",
        select=CASE, gpu=True), ("step_time",)),
    PerfRow(Mutation(
        "leak-per-microbatch", "harness/workload/pipeline.py",
        "one extra [tokens x hidden] fp32 buffer per microbatch is kept forever (a leak that grows "
        "with every microbatch)",
        "            del self.inputs[m]",
        "            setattr(run_step, 'leak', getattr(run_step, 'leak', []) + [torch.empty("
        "self.inputs[m].inputs.shape[0], self.links.hidden, device=self.links.device)]); "
        "del self.inputs[m]",
        select=CASE, gpu=True), ("mem_",)),
)


def _golden_checks(line: str) -> list[str]:
    """The check names of a gate line ``FAIL case / golden: a, b``."""
    head, _, names = line.partition(": ")
    return [n.strip() for n in names.split(",")] if "/ golden" in head else []


def _sweep(root: Path, out: Path, case: str, timeout_s: float) -> tuple[int, int, str, float]:
    t0 = time.monotonic()
    ran = _cli(root, "run", "cases/focused", "-k", case, "--out", str(out), "--label", "drill",
               timeout_s=timeout_s)
    gate = _cli(root, "gate", str(out), timeout_s=120)
    return ran.returncode, gate.returncode, gate.stdout + ran.stderr[-1500:], time.monotonic() - t0


def without_golden(root: Path, case: str) -> None:
    """Remove the committed golden values of ``case`` from the copy ``root``
    (``cases/focused/golden/<case>/``): the clean run is then judged without them (its golden
    entry skipped, with its reason), not against values recorded on another GPU."""
    shutil.rmtree(root / "cases/focused/golden" / case, ignore_errors=True)


def _with_golden(root: Path, gold: Path, case: str) -> None:
    dest = root / "cases/focused/golden" / case
    dest.mkdir(parents=True, exist_ok=True)
    for f in (gold / case).glob("golden_values_*.json"):
        shutil.copy2(f, dest / f.name)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs of the golden arm (default 3)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copies")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="limit of one focused run")
    ap.add_argument("--case", default=CASE, help=f"the focused case (default {CASE})")
    ap.add_argument("--golden-out", type=Path, default=None, metavar="DIR",
                    help="also copy the golden file(s) recorded from the repeats into DIR "
                         "(<case>/golden_values_<platform>.json, to commit under cases/focused/golden)")
    ap.add_argument("--allow-cpu", action="store_true",
                    help="run without CUDA, with a CPU case (--case tiny-moe-eager): plumbing only, "
                         "CPU runs record no memory and do not check step time, so both rows are "
                         "expected to be missed")
    args = ap.parse_args(argv)
    if not args.allow_cpu:
        import torch

        if not torch.cuda.is_available():
            ap.error(f"the rows run {args.case}, which needs a CUDA GPU (none here)")
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="dcp-perf-mutations-"))
    bad = 0
    try:
        clean = work / "clean"
        copy_repo(clean)
        without_golden(clean, args.case)
        rc, gc, text, wall = _sweep(clean, clean / "results/clean", args.case, args.timeout_s)
        print(f"clean run of {args.case}: run exit {rc}, gate exit {gc} ({wall:.0f} s)", flush=True)
        if rc not in (0,) or gc != 0:
            print(text)
            return 1
        gold = work / "golden"
        t0 = time.monotonic()
        rec = _cli(clean, "golden", "record", str(clean / "results/clean"), "--case", args.case,
                   "--repeats", str(args.repeats), "--into", str(gold), timeout_s=args.timeout_s * args.repeats)
        print(rec.stdout.rstrip(), flush=True)
        print(f"golden record --repeats {args.repeats}: exit {rec.returncode} "
              f"({time.monotonic() - t0:.0f} s)", flush=True)
        if rec.returncode != 0:
            print(rec.stderr[-2000:])
            return 1
        if args.golden_out is not None:
            shutil.copytree(gold, args.golden_out, dirs_exist_ok=True)
            print(f"golden values copied to {args.golden_out}", flush=True)
        print("| row | file | description | run exit | gate exit | failed entries | wall s |")
        print("|---|---|---|---|---|---|---|")
        rows: list[tuple[str, Optional[PerfRow]]] = [("clean-vs-golden", None)] + [
            (r.mutation.name, r) for r in ROWS]
        for name, row in rows:
            root = work / name
            copy_repo(root)
            if row is not None:
                apply(root, row.mutation)
            _with_golden(root, gold, args.case)
            rc, gc, text, wall = _sweep(root, root / "results" / name, args.case, args.timeout_s)
            failed = failed_lines(text)
            if row is None:
                ok = gc == 0
                what, where = "the clean case against the golden values just recorded", "-"
            else:
                hit = [c for line in failed for c in _golden_checks(line)
                       if c.startswith(row.expect)]
                ok = gc == 1 and bool(hit)
                what, where = row.mutation.description, row.mutation.file
            print(f"| {name} | {where} | {what} | {rc} | {gc} | "
                  f"{'<br>'.join(failed) or '-'} | {wall:.0f} |", flush=True)
            if not ok:
                bad += 1
                print(f"<!-- {name}: expected {'gate 0' if row is None else 'gate 1 through ' + str(row.expect)}"
                      f"\n{text}\n-->", flush=True)
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    total = time.monotonic() - start
    print(f"\n{len(ROWS) + 1 - bad} of {len(ROWS) + 1} rows as expected; {total:.0f} s in all")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
