"""The process every rank runs, locally (spawned by ``local.py``) and under Slurm.

    python -m harness.launch.ranks.rank_main --case CASE_JSON --arm NAME --out ARM_DIR [--emulate-rank R]

The rendezvous comes from the environment: RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR /
MASTER_PORT (torchrun, the local launcher), or Slurm's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID
(srun) when RANK is absent; a one-rank case needs none of them. CUDA_VISIBLE_DEVICES is never
changed here: the device is chosen from LOCAL_RANK by the workload.

Each completed step is appended to ``ARM_DIR/rank<k>.jsonl`` through the results store and logged
as one line for people; model, optimizer and data position are checkpointed under
``ARM_DIR/checkpoint`` so a re-run (or a Slurm requeue) resumes after the last completed step.
``kill -USR1 <pid>`` writes the Python stacks of all threads to ``ARM_DIR/stacks.rank<k>.txt``.

With ``--emulate-rank R`` (an arm of an emulated case, R one of its ranks) the process is rank R of
the arm's world alone (``harness.workload.emulate.emulate_rank``): no rendezvous and no
communicator (the loopback layer stands in for the other ranks), on ``cuda:0`` of the GPUs it sees
or on the CPU; it records into ``rank<R>.jsonl`` and, on CUDA, the live blocks at the memory probe
by pool and allocation site into ``sites.rank<R>.json`` (``harness.sites``).
There are no fault hooks here: tests fail a rank by wrapping ``harness.workload.train_arm``'s
``on_step`` callback (``tests/launch/faults.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, Sequence

if TYPE_CHECKING:
    from harness.caseplan import CasePlan, PlannedArm
    from harness.results import PredictedMemory, RunEnvironment, StepRecord, StepWriter
    from harness.results.phases import PhaseRecorder
    from harness.spec.schema import Case

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


def remove_empty_stacks(arm_dir: Path, ranks: Sequence[int]) -> None:
    """Remove the stack files of ``ranks`` that hold nothing (a rank ended by a signal never ran
    the clean-up of :func:`run_rank`)."""
    for rank in ranks:
        path = stacks_path(arm_dir, rank)
        try:
            if path.stat().st_size == 0:
                path.unlink()
        except FileNotFoundError:
            pass


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
        from harness.launch.ranks.ports import pick_free_port

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


def step_line(arm_name: str, rank: int, steps: int, record: StepRecord) -> str:
    """One human-readable line for a completed step."""
    mem = record.max_allocated_bytes
    mem_txt = f" maxalloc {mem / 2**20:.0f}MiB" if mem is not None else ""
    flags = (" NAN" if record.nan else "") + (" SKIPPED" if record.skipped else "")
    return (
        f"[{arm_name} r{rank}] step {record.step}/{steps} loss {_fmt(record.loss, '.6f')} "
        f"aux {_fmt(record.aux_loss, '.4g')} gnorm {_fmt(record.grad_norm, '.4g')} "
        f"tokens {record.tokens} cp {list(record.cp_sizes)} "
        f"{_fmt(record.step_time_s, '.3f')}s{mem_txt}{flags}"
    )


# --------------------------------------------------------------------------- entry points
def device_platform(device: object) -> str:
    """The golden platform of a torch device: ``cpu``, or the CUDA device's name as
    ``harness.golden.platform_key`` keys it (``h200``, ``gb200``)."""
    import torch

    from harness.golden import platform_key

    dev = torch.device(device)  # type: ignore[arg-type]
    if dev.type != "cuda":
        return dev.type
    return platform_key(torch.cuda.get_device_name(dev))


def memory_prediction(case: Case, rank: int, device: object, arm_name: str) -> Optional[PredictedMemory]:
    """What ``harness.memplan`` predicts for this arm on ``rank``, recorded beside what a CUDA
    rank measures (None on CPU, where no memory is measured, or for a case without a memory
    plan). A prediction that fails is said in one line and left out: it never stops the arm."""
    if "cuda" not in str(device):
        return None
    try:
        from harness.memplan.arm import rank_prediction

        return rank_prediction(case, rank)
    except Exception as e:  # noqa: BLE001 - the measurement goes on without its prediction
        print(f"[{arm_name} r{rank}] memory prediction failed, recorded without it: "
              f"{type(e).__name__}: {e}", flush=True)
        return None


def _step_callback(writer: StepWriter, rank: int, arm_name: str, steps: int,
                   platform: Optional[str] = None, environment: Optional[RunEnvironment] = None,
                   phases: Optional[PhaseRecorder] = None,
                   loaded: Optional[Callable[[], Optional[int]]] = None,
                   predicted: Optional[PredictedMemory] = None,
                   ) -> Callable[["StepRecord"], None]:
    """``loaded``: the step the checkpoint this process loaded holds (its own metadata), asked
    once, on the first record, and stamped on every record (``StepRecord.checkpoint_step``).
    ``predicted``: the memory plan's figures, on the first record (beside the environment)."""
    pending = [environment]  # the environment goes on the first record this process writes
    first = [predicted]
    checkpoint: list[Optional[int]] = []

    def on_step(record: StepRecord) -> None:
        recorded_at = time.time()
        if platform is not None and record.platform is None:
            record = dataclasses.replace(record, platform=platform)
        if loaded is not None:
            if not checkpoint:
                checkpoint.append(loaded())
            record = dataclasses.replace(record, checkpoint_step=checkpoint[0])
        if pending[0] is not None and record.environment is None:
            record = dataclasses.replace(record, environment=pending[0])
        if first[0] is not None and record.memory_predicted is None:
            record = dataclasses.replace(record, memory_predicted=first[0])
        # A step re-run after resuming from an older checkpoint is already recorded: the store
        # keeps the first record and append() returns False.
        if writer.append(record):
            pending[0] = None
            first[0] = None
            print(step_line(arm_name, rank, steps, record), flush=True)
            if record.graph_stats is not None:
                print(f"[{arm_name} r{rank}] {record.graph_stats.summary}", flush=True)
        if phases is not None:
            phases.step(record.step, record.step_time_s, recorded_at)

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


def _describe(case: Case) -> str:
    lay, ex = case.layout, case.execution
    cp = f"dynamic CP {list(lay.cp_sizes)}" if lay.dynamic else f"CP {lay.max_cp}"
    how = (f"CUDA graphs, scope {case.graphs.scope}, {ex.pools} pool(s)" if ex.graphed
           else "eager" + (", static shapes" if case.static_shapes else ""))
    return f"pp {lay.pp} vpp {lay.vpp} ep {lay.ep} {cp}; {how}"


def _open_writer(arm_dir: Path, rank: int, resume: bool) -> tuple[StepWriter, int]:
    """This rank's step store and how many steps it holds; refuses (``resume=False``) an arm
    folder that already holds steps or a checkpoint of this rank."""
    from harness.results import StepWriter

    writer = StepWriter(arm_dir, rank)
    done = writer.completed_steps()
    checkpoint_dir = arm_dir / CHECKPOINT_DIR
    if not resume and (done or (checkpoint_dir.is_dir() and any(checkpoint_dir.iterdir()))):
        raise RuntimeError(
            f"{arm_dir} already holds steps or a checkpoint of this arm; pass a fresh --out "
            "folder, or leave out --no-resume to continue after the last completed step"
        )
    return writer, done


def _timed_build(phases: PhaseRecorder) -> Callable[..., Any]:
    """The workload's model builder, with the build marked (``build_started_at`` / ``built_at``)."""
    from harness.workload.model import build_chunks

    def build(*args: Any, **kwargs: Any) -> Any:
        phases.mark("build_started_at")
        chunks = build_chunks(*args, **kwargs)
        phases.mark("built_at")
        return chunks

    return build


def _write_phases(phases: PhaseRecorder, arm_dir: Path, rank: int) -> None:
    """Append this leg's marks to ``phases.rank<k>.json``; a failure to write says so and is
    otherwise ignored (the marks are for people, never worth failing a rank over)."""
    try:
        phases.write(arm_dir, rank)
    except OSError as exc:
        print(f"[rank {rank}] could not write its phase marks: {exc}", flush=True)


def run_rank(arm: PlannedArm, arm_dir: Path, resume: bool = True,
             emulate_rank: Optional[int] = None, stop_after: Optional[int] = None,
             phases: Optional[PhaseRecorder] = None) -> None:
    """Train the planned arm ``arm`` (``harness.caseplan.PlannedArm``) as this process's rank,
    writing ``arm_dir``; every record names the device's platform (golden files are per platform)
    and the first one this process writes its environment (``harness.environment``).
    ``emulate_rank``: run that rank of an emulated arm alone (:func:`run_emulated_rank`).

    ``resume=False`` refuses an arm folder that already holds steps or a checkpoint of this rank.
    ``stop_after=K`` trains up to step K, checkpoints it and returns (the first leg of an
    interrupted arm, ``Execution.interrupt_after``; the launcher starts the second).
    ``phases``: the marks of this process so far (:func:`main` starts them); the leg's marks go
    to ``phases.rank<k>.json`` (``harness.results.phases``) when it ends.
    """
    from harness.results.phases import PhaseRecorder

    phases = phases if phases is not None else PhaseRecorder()
    phases.mark("entered_at")
    if emulate_rank is not None or arm.emulated:
        if stop_after is not None:
            from harness.errors import ConfigError

            raise ConfigError(f"arm '{arm.name}' is emulated: an emulated rank is not stopped "
                              "and resumed (compare.resume does not apply to emulated ranks)")
        run_emulated_rank(arm, arm_dir, emulate_rank, resume, phases)
        return
    import torch._dynamo  # noqa: F401  each optimizer imports it (torch._disable_dynamo): an import

    from harness.environment import current_environment
    from harness.workload import checkpoint as ckpt
    from harness.workload import init_distributed, train_arm

    phases.mark("imported_at")

    run_case = arm.case  # the derived case this arm trains (its own layout and execution)
    arm_dir = Path(arm_dir)
    arm_dir.mkdir(parents=True, exist_ok=True)
    os.environ.update(resolve_rank_env(os.environ, run_case.layout.world))
    rank = int(os.environ["RANK"])
    writer, done = _open_writer(arm_dir, rank, resume)
    checkpoint_dir = arm_dir / CHECKPOINT_DIR
    with _rank_process(arm_dir, rank, phases):
        ctx = init_distributed()
        phases.mark("rendezvous_at")
        phases.note(device=ctx.device, stop_after=stop_after)
        steps = run_case.train.steps
        print(
            f"[{arm.name} r{rank}] case {run_case.id} arm {arm.name} ({_describe(run_case)}) rank {rank}/"
            f"{ctx.world_size} on {ctx.device} ({ctx.backend}); "
            f"{done}/{steps} steps already recorded",
            flush=True,
        )
        started = time.monotonic()
        ckpt.clear_loaded(checkpoint_dir, rank)
        train_arm(run_case, ctx,
                  _step_callback(writer, rank, arm.name, steps, device_platform(ctx.device),
                                 current_environment(ctx.torch_device), phases,
                                 lambda: ckpt.loaded_step(checkpoint_dir, rank),
                                 memory_prediction(run_case, rank, ctx.device, arm.name)),
                  checkpoint_dir=checkpoint_dir, stop_after=stop_after,
                  chunk_builder=_timed_build(phases))
        phases.mark("trained_at")
        what = f"stopped after step {stop_after} as planned" if stop_after is not None else "done"
        print(f"[{arm.name} r{rank}] {what}: {writer.completed_steps()}/{steps} steps recorded in "
              f"{time.monotonic() - started:.1f}s", flush=True)
        _destroy_process_group()
        phases.mark("done_at")


@contextlib.contextmanager
def _rank_process(arm_dir: Path, rank: int, phases: "PhaseRecorder") -> Iterator[None]:
    """The life of a rank process around its training (a real rank and an emulated one alike):
    the orphan watchdog and the SIGUSR1 stack dump on the way in; on the way out, however it
    ends, the dump unregistered, an empty stack file removed and the phase marks written."""
    start_orphan_watchdog()
    stack_file = register_stack_dump(stacks_path(arm_dir, rank))
    try:
        yield
    finally:
        faulthandler.unregister(signal.SIGUSR1)
        stack_file.close()
        remove_empty_stacks(arm_dir, (rank,))
        _write_phases(phases, arm_dir, rank)


def check_emulated_rank(arm: PlannedArm, rank: Optional[int]) -> int:
    """``rank`` when ``arm`` is emulated and runs it; a ConfigError saying what is wrong else."""
    from harness.errors import ConfigError

    if not arm.emulated:
        raise ConfigError(f"arm '{arm.name}' is not emulated (its case has no emulate.ranks): "
                          "leave out --emulate-rank, or plan the case with --emulate-ranks")
    if rank is None or rank not in arm.ranks:
        got = "no --emulate-rank" if rank is None else f"--emulate-rank {rank}"
        raise ConfigError(f"arm '{arm.name}' emulates ranks {list(arm.ranks)} of its world of "
                          f"{arm.world_size}; {got}: pass one of them")
    return rank


def run_emulated_rank(arm: PlannedArm, arm_dir: Path, rank: Optional[int],
                      resume: bool = True, phases: Optional[PhaseRecorder] = None) -> None:
    """Rank ``rank`` of the emulated arm ``arm``, alone (see the module doc): resumes after the
    last completed step (from the arm's checkpoints when ``train.checkpoint_every`` saves).
    ``phases``: this process's marks so far (written to ``phases.rank<R>.json`` at the end)."""
    import torch
    import torch._dynamo  # noqa: F401  each optimizer imports it (torch._disable_dynamo): an import

    from harness.environment import current_environment
    from harness.results.phases import PhaseRecorder
    from harness.sites import SiteTable, write_sites
    from harness.spec.places import rank_place
    from harness.workload.emulate import WeightCache, emulate_rank

    phases = phases if phases is not None else PhaseRecorder()
    phases.mark("imported_at")
    rank = check_emulated_rank(arm, rank)
    run_case = arm.case
    label = rank_place(run_case, rank).label()
    arm_dir = Path(arm_dir)
    arm_dir.mkdir(parents=True, exist_ok=True)
    writer, done = _open_writer(arm_dir, rank, resume)
    with _rank_process(arm_dir, rank, phases):
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
        phases.note(device=device)
        steps = run_case.train.steps
        where = (f"{device} ({torch.cuda.get_device_name(0)})" if device != "cpu" else "cpu")
        print(f"[{arm.name} r{rank}] case {run_case.id} arm {arm.name} ({_describe(run_case)}) as "
              f"{label}, alone on {where}; communication on the loopback layer; "
              f"{done}/{steps} steps already recorded", flush=True)
        started = time.monotonic()
        result = emulate_rank(
            run_case, rank, _step_callback(writer, rank, arm.name, steps, device_platform(device),
                                           current_environment(device), phases,
                                           predicted=memory_prediction(run_case, rank, device, arm.name)),
            device=device, weights=WeightCache(threads=min(16, os.cpu_count() or 1)),
            sites=device != "cpu", checkpoint_dir=arm_dir / CHECKPOINT_DIR)
        probe = run_case.train.memory_probe_step or steps
        if result.sites is not None:  # none when it resumed after the probe: the old file stands
            write_sites(arm_dir, SiteTable(rank, probe, result.sites))
        phases.mark("trained_at")
        print(f"[{arm.name} r{rank}] done: {writer.completed_steps()}/{steps} steps recorded in "
              f"{time.monotonic() - started:.1f}s as {label}", flush=True)
        phases.mark("done_at")


def preload() -> None:
    """Import what a rank imports before its first step, creating no CUDA context and starting no
    thread: a warm server (``harness.launch.ranks.forkserver``) runs it once and forks ranks after."""
    import torch
    import torch._dynamo  # noqa: F401  each optimizer imports it
    import torch.distributed  # noqa: F401

    import harness.caseplan  # noqa: F401
    import harness.environment  # noqa: F401
    import harness.results.phases  # noqa: F401
    import harness.sites  # noqa: F401
    import harness.spec.places  # noqa: F401
    import harness.workload  # noqa: F401
    import harness.workload.checkpoint  # noqa: F401
    import harness.workload.emulate  # noqa: F401
    import harness.workload.model  # noqa: F401

    del torch


def arm_legs(arm: PlannedArm) -> tuple[Optional[int], ...]:
    """How the launchers run a planned arm: one leg (``(None,)``), or, for an arm the harness
    interrupts (``Execution.interrupt_after = K``: the ``-resumed`` arms of ``compare.resume``),
    a leg that stops after step K (its processes exit) and one that resumes from K's checkpoint."""
    k = arm.case.execution.interrupt_after
    return (None,) if k is None else (k, None)


def read_plan_beside(case_json: Path) -> CasePlan:
    """The plan (``harness.caseplan.CasePlan``) of the case folder holding ``case_json`` (a
    sweep's ``<sweep>/<case>/case.json``, with ``plan.json`` beside it); ConfigError saying what
    is wrong with it."""
    from harness.caseplan import PLAN_FILE, read_plan
    from harness.errors import ConfigError
    from harness.results import ResultsError

    path = Path(case_json)
    if not path.is_file():
        raise ConfigError(f"--case {path}: no such file; pass the case.json of a sweep's case "
                          "folder (<sweep>/<case>/case.json)")
    try:
        return read_plan(path.parent)
    except (ResultsError, OSError) as exc:
        raise ConfigError(f"--case {path}: {exc} (the {PLAN_FILE} beside it says which arms the "
                          "case has)") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.launch.ranks.rank_main",
        description="Run one rank of one arm of a case (rendezvous from the environment).",
    )
    p.add_argument("--case", required=True, type=Path, metavar="CASE_JSON",
                   help="case.json written by the sweep (its plan.json beside it names the arms)")
    p.add_argument("--arm", required=True, metavar="NAME", help="arm name, e.g. eager, graph, dcp")
    p.add_argument("--out", required=True, type=Path, metavar="ARM_DIR", help="the arm's results folder")
    p.add_argument("--no-resume", dest="resume", action="store_false",
                   help="refuse an arm folder that already holds steps instead of resuming")
    p.add_argument("--emulate-rank", dest="emulate_rank", type=int, default=None, metavar="R",
                   help="an emulated arm: run its rank R alone (no rendezvous; loopback "
                        "communication)")
    p.add_argument("--stop-after", type=int, default=None, metavar="STEP",
                   help="train up to STEP, checkpoint it and exit (the first leg of an arm the "
                        "launcher interrupts and resumes: compare.resume)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    main_at = time.time()  # the interpreter is up and harness imported: the rest is imports
    from harness.errors import ConfigError
    from harness.results.phases import PhaseRecorder, process_spawned_at

    phases = PhaseRecorder(spawned_at=process_spawned_at())
    phases.mark("main_at", at=main_at)
    args = build_parser().parse_args(argv)
    try:
        arm = read_plan_beside(args.case).arm(args.arm)
        if args.emulate_rank is not None or arm.emulated:
            check_emulated_rank(arm, args.emulate_rank)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    faulthandler.enable(file=sys.stderr, all_threads=True)  # segfaults/aborts print stacks too
    run_rank(arm, args.out, resume=args.resume, emulate_rank=args.emulate_rank,
             stop_after=args.stop_after, phases=phases)
    return 0


def exit_now(code: int) -> None:
    """End the rank process with ``code`` once its work is on disk (its records appended with
    fsync, its marks written, its process group destroyed) without tearing the interpreter down:
    that teardown writes nothing a run needs and costs 0.4-2 s per rank process (unloading
    torch's modules; measured with ``bench/arm_phases.py``, the ``exit`` phase)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())  # an exception ends the process the ordinary way, its traceback printed
