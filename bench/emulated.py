"""Emulated ranks on one GPU: TE #3353's validation table beside ours, and the fit check.

The emulated ranks themselves run through the harness (``emulate.ranks`` in a case, or
``dcp-harness run CASE --emulate-ranks 0,7``: a process per (arm, rank), each rank alone as rank r
of the case's world, communication on the loopback layer). This script reads what such a sweep
left and prints, per case of emulated ranks, the table of ``harness.report.emulated`` (the same
section as the sweep's summary.md): capture line, graph vs eager bitwise steps, NaN / skipped,
CP sizes replayed and the replays per (CP size, physical slot) frame, graph pool and arenas,
slot-shared pool / largest variant and separate pools / largest, DCP+graph vs fixed-CP+graph
whole-device (MiB, % of the device), active and reserved deltas after empty_cache, compute step
time, and each rank's allocator snapshot diff (the reserved delta explained):

  python bench/emulated.py SWEEP [SWEEP ...] [--markdown FILE]

``--fit CASE`` answers the question before a run: does a rank fit this GPU? It trains the rank's
eager arm for ``--fit-steps`` steps in this process and extrapolates the peak to the most forwards
its schedule can hold at once over every microbatch count the case can reach (exit 0 fits, 4 does
not; CUDA only):

  python bench/emulated.py --fit CASE.yaml [--case-id ID] [--rank R] [--fit-steps N] [--json FILE]

Exit status of the table: 0 printed, 2 no case of emulated ranks in the sweeps.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.report import load_sweep  # noqa: E402
from harness.report.emulated import emulated_tables  # noqa: E402
from harness.results import dumps  # noqa: E402
from harness.trust.stored_plan import check_stored_plan  # noqa: E402

MiB = 2**20


def fit_check(case: Any, rank: int, steps: int, threads: int) -> dict[str, Any]:
    """Does ``rank`` fit the device? Its eager arm for ``steps`` steps; the peak extrapolated to
    the most forwards this rank's schedule holds at once over every count the case can reach."""
    import torch

    from harness.arms import arm_case, arm_spec
    from harness.results import StepRecord
    from harness.slotmem.schedule import warmup_count
    from harness.spec.preflight import preflight
    from harness.spec.schema import Case
    from harness.workload.emulate import WeightCache, emulate_rank, rank_place
    from harness.graphplan.layout import reachable_microbatch_counts

    eager = arm_case(case, arm_spec(case, "eager").name)
    short = max(steps, (case.graphs.warmup_steps + 1) if case.graphs is not None else 1)
    data = eager.model_dump(mode="python")
    data["train"].update(steps=short, memory_probe_step=None)
    arm = Case.model_validate(data)  # the eager arm for fewer steps, preflighted like any case
    problems = preflight(arm)
    if problems:
        raise SystemExit(f"{case.id}: {short} steps cannot run: "
                         + "; ".join(f"{p.field}: {p.message}" for p in problems))
    lay, place = case.layout, rank_place(case, rank)
    cache = WeightCache(threads=threads)
    static = 4 * cache.param_bytes(case, rank)
    recs: list[StepRecord] = []
    oom = None
    torch.cuda.reset_peak_memory_stats()
    try:
        emulate_rank(arm, rank, recs.append, weights=cache)
    except torch.cuda.OutOfMemoryError as exc:
        oom = str(exc).splitlines()[0][:300]
    peak = max([r.max_allocated_bytes or 0 for r in recs] + [torch.cuda.max_memory_allocated()])
    total = torch.cuda.mem_get_info()[1]
    ran = [r.microbatches or 0 for r in recs]
    held = lambda m: warmup_count(lay.pp, place.pp_rank, m, lay.vpp, lay.group) + 1  # noqa: E731
    worst = max(held(m) for m in reachable_microbatch_counts(lay.pp, lay.vpp, lay.group,
                                                             case.train.global_batch))
    seen = max((held(m) for m in ran), default=worst)
    predicted = static + (peak - static) * worst / seen if oom is None else None
    fits = oom is None and predicted is not None and predicted < 0.95 * total
    return {"label": place.label(), "fits": fits, "oom": oom, "steps_run": len(recs),
            "microbatches": ran, "peak_mib": peak / MiB, "device_total_mib": total / MiB,
            "params_grads_adam_mib": static / MiB, "activations_peak_mib": (peak - static) / MiB,
            "forwards_held_seen": seen, "forwards_held_worst": worst,
            "predicted_peak_mib": None if predicted is None else predicted / MiB}


def _fit(args: argparse.Namespace) -> int:
    import torch

    from harness.spec.loader import load_cases

    cases = load_cases([args.fit])
    if args.case_id is not None:
        cases = [c for c in cases if c.id == args.case_id]
    if len(cases) != 1:
        print(f"{args.fit}: pick one case with --case-id (have {[c.id for c in cases]})",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench/emulated.py --fit needs a CUDA GPU", file=sys.stderr)
        return 2
    case = cases[0]
    fit = fit_check(case, args.rank, args.fit_steps, args.threads)
    print(f"[{fit['label']}] fit check: " + dumps(fit, indent=None), flush=True)
    if args.json:
        Path(args.json).write_text(dumps({"case": case.id, "device": torch.cuda.get_device_name(),
                                          "fit": fit}) + "\n")
    return 0 if fit["fits"] else 4


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="*", metavar="SWEEP", help="sweep folders (dcp-harness run --out)")
    ap.add_argument("--markdown", default=None, metavar="FILE", help="also write the tables here")
    ap.add_argument("--fit", default=None, metavar="CASE", help="fit check of a case file instead")
    ap.add_argument("--case-id", default=None, help="with --fit: one case of a matrix")
    ap.add_argument("--rank", type=int, default=0, help="with --fit: the rank (default 0)")
    ap.add_argument("--fit-steps", type=int, default=3, help="with --fit: eager steps to run")
    ap.add_argument("--threads", type=int, default=8, help="with --fit: CPU threads of the init")
    ap.add_argument("--json", default=None, help="with --fit: write the result here")
    args = ap.parse_args(argv)
    if args.fit is not None:
        return _fit(args)
    if not args.sweeps:
        ap.error("give sweep folders, or --fit CASE")
    text = "\n\n".join(t for t in (emulated_tables(load_sweep(s, check_stored_plan)) for s in args.sweeps)
                       if t)
    if not text:
        print(f"no case of emulated ranks in {' '.join(args.sweeps)}", file=sys.stderr)
        return 2
    print(text, flush=True)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:  # a crash is 3, not "nothing to show" (2)
        traceback.print_exc()
        sys.exit(3)
