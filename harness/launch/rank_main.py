"""The process every rank runs, locally (spawned by ``local.py``) and under Slurm.

    python -m harness.launch.rank_main --case CASE_JSON --arm NAME --out ARM_DIR

The rendezvous comes from the environment: RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR /
MASTER_PORT (torchrun, the local launcher), or Slurm's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID
(srun) when RANK is absent; a one-rank case needs none of them. CUDA_VISIBLE_DEVICES is never
changed here: the device is chosen from LOCAL_RANK by the workload.

Each completed step is appended to ``ARM_DIR/rank<k>.jsonl`` through the results store and logged
as one line for people; model, optimizer and data position are checkpointed under
``ARM_DIR/checkpoint`` so a re-run (or a Slurm requeue) resumes after the last completed step.
``kill -USR1 <pid>`` writes the Python stacks of all threads to ``ARM_DIR/stacks.rank<k>.txt``.
There are no fault hooks here: tests fail a rank by wrapping ``harness.workload.train_arm``'s
``on_step`` callback (``tests/launch/faults.py``).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Mapping, Optional, Sequence

if TYPE_CHECKING:
    from harness.results import StepRecord

# Set by the local launcher: its pid. A rank whose launcher is gone stops itself (no orphans).
LAUNCHER_PID_ENV = "DCP_HARNESS_LAUNCHER_PID"
_ORPHAN_POLL_S = 1.0
CHECKPOINT_DIR = "checkpoint"
# Port for a Slurm job without MASTER_PORT: derived from the job id so every task agrees on it.
_SLURM_PORT_BASE = 15000
_SLURM_PORT_SPAN = 17000  # ports 15000-31999: below the ephemeral range (32768-)


def stacks_path(arm_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its Python stacks on SIGUSR1."""
    return Path(arm_dir) / f"stacks.rank{rank}.txt"


# --------------------------------------------------------------------------- environment
def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list (``gpu[003-010,012],cpu1`` -> ``gpu003``)."""
    nodelist = nodelist.strip()
    if not nodelist:
        raise ValueError("empty Slurm node list")
    depth = 0
    end = len(nodelist)
    for i, ch in enumerate(nodelist):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            end = i
            break
    first = nodelist[:end]
    match = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", first)
    if not match:
        return first
    prefix, ranges, suffix = match.groups()
    lo = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{lo}{suffix}"


def resolve_rank_env(environ: Mapping[str, str], world_size: int) -> dict[str, str]:
    """The torch.distributed variables for this process, from ``environ``.

    RANK given: used as is (the other four must be there too). Otherwise Slurm's SLURM_PROCID /
    SLURM_NTASKS / SLURM_LOCALID, with MASTER_ADDR from the job's first node and MASTER_PORT from the
    job id when absent. Otherwise a one-rank case runs alone on 127.0.0.1.
    """
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    if "RANK" in environ:
        env = {k: environ[k] for k in keys if k in environ}
        missing = [k for k in keys if not env.get(k)]
        if missing:
            raise RuntimeError(
                f"RANK is set but {', '.join(missing)} is not; set all of {', '.join(keys)} "
                "(torchrun and the local launcher do)"
            )
    elif "SLURM_PROCID" in environ:
        env = {
            "RANK": environ["SLURM_PROCID"],
            "WORLD_SIZE": environ.get("SLURM_NTASKS", ""),
            "LOCAL_RANK": environ.get("SLURM_LOCALID", ""),
        }
        if not env["WORLD_SIZE"] or not env["LOCAL_RANK"]:
            raise RuntimeError("SLURM_PROCID is set but SLURM_NTASKS or SLURM_LOCALID is not; "
                               "launch ranks with srun")
        addr = environ.get("MASTER_ADDR") or first_slurm_host(
            environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or "127.0.0.1")
        port = environ.get("MASTER_PORT")
        if not port:
            job = int(re.sub(r"\D", "", environ.get("SLURM_JOB_ID", "0")) or 0)
            port = str(_SLURM_PORT_BASE + job % _SLURM_PORT_SPAN)
        env.update(MASTER_ADDR=addr, MASTER_PORT=port)
    elif world_size == 1:
        from harness.launch.ports import pick_free_port

        env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(pick_free_port())}
    else:
        raise RuntimeError(
            f"this case has {world_size} ranks but RANK is not set; start it with "
            "`python -m harness.launch.local` (or torchrun / srun)"
        )
    if int(env["WORLD_SIZE"]) != world_size:
        raise RuntimeError(
            f"WORLD_SIZE={env['WORLD_SIZE']} but the case needs {world_size} ranks "
            "(resources.nodes * resources.gpus_per_node)"
        )
    return env


# --------------------------------------------------------------------------- logging
def _fmt(value: object, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec)


def step_line(arm_name: str, rank: int, steps: int, record: Mapping[str, object]) -> str:
    """One human-readable line for a completed step."""
    mem = record.get("max_allocated_bytes")
    mem_txt = f" maxalloc {int(mem) / 2**20:.0f}MiB" if isinstance(mem, (int, float)) else ""
    flags = "".join(f" {k.upper()}" for k in ("nan", "skipped") if record.get(k))
    return (
        f"[{arm_name} r{rank}] step {record.get('step')}/{steps} loss {_fmt(record.get('loss'), '.6f')} "
        f"aux {_fmt(record.get('aux_loss'), '.4g')} gnorm {_fmt(record.get('grad_norm'), '.4g')} "
        f"tokens {record.get('tokens')} cp {record.get('cp_sizes')} "
        f"{_fmt(record.get('step_time_s'), '.3f')}s{mem_txt}{flags}"
    )


# --------------------------------------------------------------------------- entry points
def _step_callback(writer, rank: int, arm_name: str, steps: int) -> Callable[["StepRecord"], None]:
    def on_step(record: StepRecord) -> None:
        # A step re-run after resuming from an older checkpoint is already recorded: the store
        # keeps the first record and append() returns False.
        if writer.append(record):
            print(step_line(arm_name, rank, steps, record.to_dict()), flush=True)
            if record.graph_stats is not None:
                print(f"[{arm_name} r{rank}] {record.graph_stats.summary}", flush=True)

    return on_step


def register_stack_dump(path: Path) -> IO[str]:
    """``kill -USR1`` this process -> Python stacks of all its threads appended to ``path``."""
    handle = open(path, "w", encoding="utf-8")
    faulthandler.register(signal.SIGUSR1, file=handle, all_threads=True, chain=False)
    return handle


def start_orphan_watchdog(environ: Mapping[str, str] = os.environ) -> Optional[threading.Thread]:
    """Under the local launcher, stop this rank (and its process group, which it leads) as soon as
    the launcher process is gone, e.g. killed with SIGKILL. Elsewhere (Slurm, torchrun): nothing."""
    launcher = environ.get(LAUNCHER_PID_ENV)
    if not launcher:
        return None
    parent = int(launcher)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_ORPHAN_POLL_S)
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)

    thread = threading.Thread(target=watch, name="orphan-watchdog", daemon=True)
    thread.start()
    return thread


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _describe(case) -> str:
    lay, ex = case.layout, case.execution
    cp = f"dynamic CP {list(lay.cp_sizes)}" if lay.dynamic else f"CP {lay.max_cp}"
    how = (f"CUDA graphs, scope {case.graphs.scope}, {ex.pools} pool(s)" if ex.graphed
           else "eager" + (", static shapes" if case.static_shapes else ""))
    return f"pp {lay.pp} vpp {lay.vpp} ep {lay.ep} {cp}; {how}"


def run_rank(case, arm_name: str, arm_dir: Path, resume: bool = True) -> None:
    """Train arm ``arm_name`` of ``case`` as this process's rank, writing ``arm_dir``.

    ``resume=False`` refuses an arm folder that already holds steps or a checkpoint of this rank.
    """
    from harness.arms import arm_by_name
    from harness.results import StepWriter
    from harness.workload import init_distributed, train_arm

    arm = arm_by_name(case, arm_name)
    run_case = arm.case  # the derived case this arm trains (its own layout and execution)
    arm_dir = Path(arm_dir)
    arm_dir.mkdir(parents=True, exist_ok=True)
    os.environ.update(resolve_rank_env(os.environ, run_case.layout.world))
    rank = int(os.environ["RANK"])
    writer = StepWriter(arm_dir, rank)
    done = writer.completed_steps()
    checkpoint_dir = arm_dir / CHECKPOINT_DIR
    if not resume and (done or (checkpoint_dir.is_dir() and any(checkpoint_dir.iterdir()))):
        raise RuntimeError(
            f"{arm_dir} already holds steps or a checkpoint of this arm; pass a fresh --out "
            "folder, or leave out --no-resume to continue after the last completed step"
        )
    start_orphan_watchdog()
    stack_file = register_stack_dump(stacks_path(arm_dir, rank))
    try:
        ctx = init_distributed()
        steps = case.train.steps
        print(
            f"[{arm.name} r{rank}] case {case.id} arm {arm.name} ({_describe(run_case)}) rank {rank}/"
            f"{ctx.world_size} on {ctx.device} ({ctx.backend}); "
            f"{done}/{steps} steps already recorded",
            flush=True,
        )
        started = time.monotonic()
        train_arm(run_case, ctx,
                  _step_callback(writer, rank, arm.name, steps),
                  checkpoint_dir=checkpoint_dir)
        print(f"[{arm.name} r{rank}] done: {writer.completed_steps()}/{steps} steps recorded in "
              f"{time.monotonic() - started:.1f}s", flush=True)
        _destroy_process_group()
    finally:
        faulthandler.unregister(signal.SIGUSR1)
        stack_file.close()
        if stacks_path(arm_dir, rank).stat().st_size == 0:
            stacks_path(arm_dir, rank).unlink()


def read_case_json(path: Path):
    """The case of a ``case.json`` written by a sweep; ConfigError saying what is wrong with it."""
    from pydantic import ValidationError

    from harness.errors import ConfigError
    from harness.spec.schema import Case

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--case {path}: no such file; pass the case.json of a sweep's case "
                          "folder (<sweep>/<case>/case.json)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--case {path}: not a readable JSON file ({exc})") from None
    try:
        return Case.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"--case {path}: not a case written by this dcp-harness version "
                          f"({exc.error_count()} problem(s), first: {exc.errors()[0]['msg']})") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.launch.rank_main",
        description="Run one rank of one arm of a case (rendezvous from the environment).",
    )
    p.add_argument("--case", required=True, type=Path, metavar="CASE_JSON",
                   help="case.json written by the sweep (Case.model_dump)")
    p.add_argument("--arm", required=True, metavar="NAME", help="arm name, e.g. eager, graph, dcp")
    p.add_argument("--out", required=True, type=Path, metavar="ARM_DIR", help="the arm's results folder")
    p.add_argument("--no-resume", dest="resume", action="store_false",
                   help="refuse an arm folder that already holds steps instead of resuming")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    case = read_case_json(args.case)
    faulthandler.enable(file=sys.stderr, all_threads=True)  # segfaults/aborts print stacks too
    run_rank(case, args.arm, args.out, resume=args.resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
