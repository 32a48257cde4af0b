"""Run a function on ``world`` spawned CPU ranks (gloo) and collect each rank's JSON result.

The function must be importable (module level) and take ``(ctx: RankContext, *args)``; several
training jobs share one spawn (:func:`train_jobs`) because process start-up dominates on CPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp

from harness.launch.ranks.ports import pick_free_port
from harness.results import record_json


def _worker(rank: int, world: int, port: int, fn: Callable, args: tuple, out: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    import torch.distributed as dist

    from harness.workload import init_distributed

    ctx = init_distributed(timeout_s=60)
    try:
        result = fn(ctx, *args)
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run_spawned(world: int, fn: Callable, args: tuple, tmp: Path) -> list[Any]:
    """``[result of rank 0, result of rank 1, ...]``."""
    tmp.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_worker, args=(world, pick_free_port(), fn, args, str(tmp)), nprocs=world,
                       start_method="spawn", join=True)
    return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]


def job_case(case_json: dict, options: dict):
    """The case a job trains: ``fixed_cp: N`` derives the fixed-CP arm case
    (``harness.spec.derive.as_fixed_cp``); ``static: {scope, max_seqs}`` turns on static shapes
    (``shapes: {mode: static}``: a graph case's eager arm without the graphs)."""
    from harness.spec.derive import as_fixed_cp
    from harness.spec.schema import Case, ShapesSpec

    case = Case.model_validate(case_json)
    if options.get("fixed_cp") is not None:
        case = as_fixed_cp(case, options["fixed_cp"], f"fixed-cp{options['fixed_cp']}")
    static = options.get("static")
    if static is not None:
        train = case.train.model_copy(update={"max_seqs_per_microbatch": static["max_seqs"]})
        case = case.model_copy(update={"shapes": ShapesSpec(scope=static["scope"]), "train": train})
    return case


def train_jobs(ctx, jobs: list[tuple[str, dict, dict]]) -> dict[str, list[dict]]:
    """Run each ``(name, case json, options)`` job (see :func:`job_case`); ``{name: records}``."""
    from harness.workload import train_arm

    from tests.workload.factories import eager_arm

    results: dict[str, list[dict]] = {}
    for name, case_json, options in jobs:
        records: list[dict] = []
        train_arm(eager_arm(job_case(case_json, options)), ctx, lambda r: records.append(record_json(r)))
        results[name] = records
    return results


def run_train_jobs(world: int, jobs: list[tuple[str, Any, dict]], tmp: Path) -> dict[str, list[list[dict]]]:
    """``{job name: [records of rank 0, records of rank 1, ...]}`` (Case objects in ``jobs``)."""
    payload = [(name, case.model_dump(mode="json"), opts) for name, case, opts in jobs]
    per_rank = run_spawned(world, train_jobs, (payload,), tmp)
    return {name: [per_rank[r][name] for r in range(world)] for name, _, _ in jobs}
