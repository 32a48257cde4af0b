"""index.html: its size and how long headless Chromium takes to open it.

Two sweeps can be measured:

* ``--sweep DIR``: an existing sweep folder (e.g. ``dcp-harness run cases/focused --out DIR`` on
  this machine); its reports are written again first (timed).
* ``--regression OUT``: the regression cases (``cases/regression``: 2 x 4 GB200 GPUs each, so they
  cannot run on a CPU machine) as a sweep of their real plans (every planned arm and rank,
  ``train.steps`` steps each) whose step records are synthesized with CUDA figures (loss, grad
  norm, step time, allocated / reserved / peak memory, a memory probe; graph arms' capture
  statistics and replays), one arm's loss drifted so one entry fails, judged by the harness's own
  judge (``finalize_case``). What the page holds per entry is what a real run of those cases
  gives it; the values are made up.

For each: the page's bytes and figures, then ``--repeats`` loads in one headless Chromium
(``tests/browser.py``): the wall time of the load (WebDriver's ``get`` returns after the load
event) and the browser's own navigation timing (``loadEventEnd``), median and max.

    python bench/page_size.py --regression /tmp/page-regression --sweep results/latest
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.arms import plan_case  # noqa: E402
from harness.caseplan import CasePlan  # noqa: E402
from harness.launch.sweep_folder import finalize_case, prepare_case_dir, record_manifest  # noqa: E402
from harness.report import PAGE_FILE, write_reports  # noqa: E402
from harness.results import (ArmOutcome, FrameReplays, GraphStats, MemoryProbe, StepRecord,  # noqa: E402
                             StepWriter, write_outcome)
from harness.spec import load_cases  # noqa: E402

GIB = 1024 ** 3
LIMIT_BYTES = 5 * 1024 ** 2
LIMIT_OPEN_S = 2.0


def graph_stats(separate: bool) -> GraphStats:
    """A rank's capture of 2 CP variants: one slot-shared pool, or one pool per CP size."""
    pool = (5.1 if separate else 3.0) * GIB
    return GraphStats(summary="2 dynamic-CP variants over 8 slot-aliased physical pool slots",
                      variants=2, physical_slots=8, graphs=192, pool_reserved_bytes=int(pool),
                      pool_allocated_bytes=int(pool * 0.9), arena_bytes=0,
                      largest_pool_bytes=int(3.0 * GIB), pools=2 if separate else 1,
                      capture_s=4.2, warmup_s=6.0, capture_peak_bytes=int(pool),
                      warmup_peak_bytes=int(pool))


def rank_records(rank: int, steps: int, probe_step: int, drift: float, rng: random.Random,
             shared: random.Random, graph: Optional[GraphStats]) -> list[StepRecord]:
    """One rank's records; a graph arm captures after step 2 and replays from step 3 on. Loss and
    grad norm come from ``shared`` (the same on every rank, as the ranks_agree check wants);
    memory and time from the rank's own ``rng``."""
    out = []
    for step in range(1, steps + 1):
        loss = (11.0 * math.exp(-step / 30) + 1.5 + shared.gauss(0, 0.004)
                + drift * max(step - steps // 2, 0))
        grad_norm = abs(1.2 * math.exp(-step / 20) + shared.gauss(0, 0.02))
        used = 60 * GIB + rank * 0.25 * GIB + rng.random() * 0.1 * GIB
        probe = (MemoryProbe(device_used_bytes=int(used + 8 * GIB), device_total_bytes=186 * GIB,
                             allocated_bytes=int(used), active_bytes=int(used),
                             reserved_bytes=int(used + 4 * GIB)) if step == probe_step else None)
        graphed = graph is not None and step >= 3
        out.append(StepRecord(
            step=step, loss=loss, aux_loss=0.01 + 0.001 * math.exp(-step / 10),
            grad_norm=grad_norm,
            step_time_s=2.4 + rng.gauss(0, 0.05), device=f"cuda:{rank % 4}", platform="gb200",
            allocated_bytes=int(used), reserved_bytes=int(used + 4 * GIB),
            max_allocated_bytes=int(used + 6 * GIB), graphed=graphed, memory_probe=probe,
            graph_stats=graph if graph is not None and step == 2 else None,
            replays=(FrameReplays(cp_size=1, slot=0, replays=24),
                     FrameReplays(cp_size=2, slot=1, replays=24)) if graphed else ()))
    return out


def write_arms(plan: CasePlan, case_dir: Path, drift_arm: Optional[str], repro: str) -> None:
    """Every planned arm's step records (every rank, ``train.steps`` steps: :func:`rank_records`)
    and outcome (``ok``) in ``case_dir``; the arm named ``drift_arm`` drifts in its second half."""
    train = plan.case.train
    probe_step = train.memory_probe_step or train.steps
    for arm in plan.arms:
        drift = 0.002 if arm.name == drift_arm else 0.0
        graph = graph_stats("separate" in arm.name) if arm.kind != "eager" else None
        for rank in arm.ranks:
            writer = StepWriter(case_dir / arm.name, rank)
            rng = random.Random(f"{plan.case.id}/{rank}")  # the same data in every arm
            shared = random.Random(f"{plan.case.id}/shared")  # what every rank agrees on
            for rec in rank_records(rank, train.steps, probe_step, drift, rng, shared, graph):
                writer.append(rec)
        write_outcome(case_dir / arm.name, ArmOutcome(
            status="ok", returncode=0, wall_s=train.steps * 2.5, repro=repro))


def regression_sweep(out: Path, cases_dir: Path = ROOT / "cases" / "regression") -> Path:
    """The regression cases' plans in ``out`` with synthesized records (module doc), judged."""
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} exists and is not empty: give a new folder")
    plans = [plan_case(case) for case in load_cases([cases_dir])]
    record_manifest(plans, out)
    for n, plan in enumerate(plans):
        case_dir = prepare_case_dir(plan, out)
        # One arm of the first case drifts in its second half: that entry fails (a regression).
        drift_arm = next(a.name for a in plan.arms if not a.repeat) if n == 0 else None
        write_arms(plan, case_dir, drift_arm,
                   f"dcp-harness submit cases/regression -k {plan.case.id} --profile gb200")
        finalize_case(case_dir)
    return out


def measure(sweep: Path, repeats: int) -> dict[str, Any]:
    """Write the reports, then open index.html ``repeats`` times in one headless Chromium."""
    from tests.browser import start_browser

    t0 = time.perf_counter()
    files = write_reports(sweep)
    write_s = time.perf_counter() - t0
    page = sweep / PAGE_FILE
    text = page.read_text(encoding="utf-8")
    figures = text.count('<div class="figure">')
    with tempfile.TemporaryDirectory() as profile:
        browser = start_browser(Path(profile))
        try:
            walls, loads = browser.timed_opens(page, repeats)
            rows = browser.count("#entry-table tr.entry")
        finally:
            browser.driver.quit()
    return {
        "sweep": str(sweep), "cases": len(files.sweep.cases), "entries": len(files.sweep.rows),
        "entry_rows": rows, "figures": figures, "gate_exit": files.exit_code,
        "bytes": page.stat().st_size, "write_reports_s": round(write_s, 2),
        "open_wall_s": {"median": round(statistics.median(walls), 3), "max": round(max(walls), 3)},
        "load_event_s": {"median": round(statistics.median(loads), 3), "max": round(max(loads), 3)},
        "repeats": repeats,
        "within": page.stat().st_size < LIMIT_BYTES and max(walls) < LIMIT_OPEN_S,
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", type=Path, action="append", default=[],
                        help="an existing sweep folder to measure (repeatable)")
    parser.add_argument("--regression", type=Path, metavar="OUT",
                        help="build the regression cases' sweep in OUT (a new folder), measure it")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    sweeps = list(args.sweep)
    if args.regression is not None:
        sweeps.insert(0, regression_sweep(args.regression))
    if not sweeps:
        parser.error("give --regression OUT and/or --sweep DIR")
    results = [measure(s, args.repeats) for s in sweeps]
    for r in results:
        print(json.dumps(r))
    return 0 if all(r["within"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
