"""Run one arm of a command case (``command:``): the case's training command in place of the
built-in workload, then its metrics read into ``<arm>/rank<k>.jsonl``. The local launcher
(:func:`run_command_arm`) and a Slurm job (``slurm.job``, each task its own rank or node) share
what is here: the arm's command (:func:`arm_command`), its rendezvous variables
(:func:`rendezvous_env`), the metrics clean-up before the start (:func:`prepare_metrics`) and the
conversion after it (:func:`record_metrics`); its repro line is ``launch.ranks.repro``'s.

The arm's argument vector is ``command.argv`` plus its role's arguments, placeholders filled
(``harness.spec.command``); it starts in ``command.cwd`` (relative to the case file's folder).
``ranks: per_rank`` starts one process per rank with RANK / LOCAL_RANK / WORLD_SIZE /
LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT set (``processes.run_ranks``, the same process handling
as the built-in ranks: output to ``log.txt`` prefixed ``[rank k]``, time limit, clean-up);
``ranks: launcher`` starts one process per node (a launcher such as torchrun) with NNODES /
NODE_RANK / NPROC_PER_NODE / MASTER_ADDR / MASTER_PORT set, and the same as ``PET_*``, which
torchrun reads for ``--nnodes``, ``--node-rank``, ``--nproc-per-node``, ``--master-addr`` and
``--master-port`` (its arguments may also name ``{master_port}`` ...: the port is fixed before
the start). ``command.env`` is added to the environment and ``secret_env`` is passed from the
harness's own environment: its values are never written (the names only, in ``case.json`` and
``plan.json``), and a value the command prints is ``***`` in the log. The command also sees
``DCP_HARNESS_METRICS_DIR`` (``<arm>/metrics``, where ``harness.metrics.StepRecorder`` writes).

Once every process exited 0 the metrics source is read (``harness.metrics.read_source``) and each
rank's records are written to ``rank<k>.jsonl``. A command that is not found, exits non-zero,
writes no metrics or metrics that cannot be read fails the arm with the reason naming the arm;
fewer steps than planned or NaN are the arm checks' FAIL (``steps_complete``, ``no_nan_inf``).
The repro line (``launch.ranks.repro``) is the command itself, every rank of it, with the variables
the harness set (rendezvous on 127.0.0.1:29500, ``{arm_dir}`` in ``/tmp/dcp-repro``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from harness.caseplan import CasePlan, PlannedArm
from harness.golden import platform_key
from harness.launch.ranks.command_resume import (Checkpointed, Leg, resume_legs,
                                                 resumed_records, run_resumed, write_records)
from harness.launch.ranks.command_env import needs_probe, probe_command, with_environment
from harness.launch.ranks.ports import pick_free_port
from harness.launch.ranks.processes import ProcessStart, RankCommand, device_env, run_ranks
from harness.launch.ranks.variation import variation
from harness.metrics import (METRICS_DIR_ENV, MetricsError, read_source, source_mark,
                             source_path, stale_files)
from harness.environment import describe
from harness.results import LOG_FILE, ArmOutcome, StepRecord, StepWriter, inherited, write_arm_env
from harness.spec.command import FIXED_CP_ROLES, arm_argv, command_dir, fill
from harness.spec.schema import CommandSpec, RankStart

METRICS_DIR = "metrics"
# A launcher's (torchrun's) workers share its output: torchrun tees each worker's lines prefixed
# with its global rank (``[rank1]: ...``, torch.distributed's own style) when told so, which
# keeps each rank's lines apart in log.txt under the node's ``[node k]`` (``--tee`` given in
# the command's arguments wins).
TORCHRUN_PREFIXES = {"PET_TEE": "3", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "}
REPRO_PORT = 29500  # torchrun's default


@dataclass(frozen=True)
class Rendezvous:
    """Where one process of an arm meets the others: the first node's address and a port, and
    which process it is (``ranks: per_rank``: its rank and its rank on the node; ``launcher``:
    its node)."""

    master_addr: str = "127.0.0.1"
    master_port: int = REPRO_PORT
    index: int = 0
    local_index: int = 0


@dataclass(frozen=True)
class ArmCommand:
    """One arm's command, ready to start: ``env`` is what the harness adds to the environment
    (secret values included), ``secrets`` the values printed as ``***``, ``metrics_path`` the
    source's path (placeholders filled, ``{rank}`` kept), ``problem`` why it cannot start."""

    argv: tuple[str, ...]
    cwd: Path
    env: Mapping[str, str]
    secrets: tuple[str, ...]
    metrics_path: str
    problem: Optional[str]


def launcher_mode(plan: CasePlan) -> bool:
    """One process per node (a launcher) rather than one per rank."""
    assert plan.case.command is not None
    return plan.case.command.ranks is RankStart.LAUNCHER


def starters(plan: CasePlan, arm: PlannedArm) -> int:
    """The processes the harness starts for ``arm``: one per rank, or one per node."""
    return arm.case.resources.nodes if launcher_mode(plan) else arm.world_size


def placeholder_values(plan: CasePlan, arm: PlannedArm, arm_dir: Path,
                       place: Rendezvous = Rendezvous()) -> dict[str, object]:
    """What the placeholders of ``harness.spec.command.PLACEHOLDERS`` stand for in this arm."""
    case = arm.case
    values: dict[str, object] = {
        "arm_dir": Path(arm_dir).resolve(), "steps": case.train.steps,
        "world_size": arm.world_size, "seed": case.train.seed,
        "case_dir": Path(plan.source).parent, "nnodes": case.resources.nodes,
        "nproc_per_node": case.resources.gpus_per_node, "master_addr": place.master_addr,
        "master_port": place.master_port, "node_rank": place.index}
    if arm.kind in FIXED_CP_ROLES:
        values["fixed_cp"] = case.layout.max_cp
    if case.execution.interrupt_after is not None:  # a -resumed arm (compare.resume)
        values["stop"] = case.execution.interrupt_after
    return values


def rendezvous_env(plan: CasePlan, arm: PlannedArm, place: Rendezvous) -> dict[str, str]:
    """The variables the harness sets for the process of ``arm`` at ``place`` (module doc)."""
    res = arm.case.resources
    common = {"MASTER_ADDR": place.master_addr, "MASTER_PORT": str(place.master_port)}
    if launcher_mode(plan):
        env = {"NNODES": str(res.nodes), "NODE_RANK": str(place.index),
               "NPROC_PER_NODE": str(res.gpus_per_node), **common}
        return {**env, **{f"PET_{k}": v for k, v in env.items()}, **TORCHRUN_PREFIXES}
    return {"RANK": str(place.index), "LOCAL_RANK": str(place.local_index),
            "WORLD_SIZE": str(arm.world_size), "LOCAL_WORLD_SIZE": str(res.gpus_per_node),
            **common}


def process_label(plan: CasePlan) -> str:
    """What one process the harness starts is, in the log's ``[<label> k]`` prefixes."""
    return "node" if launcher_mode(plan) else "rank"


def command_cwd(plan: CasePlan, command: CommandSpec) -> Path:
    """Where the command starts: ``command.cwd`` relative to the case file's folder."""
    return command_dir(plan.source, command)


def find_program(program: str, cwd: Path, path: Optional[str]) -> Optional[str]:
    """The executable ``program`` names (a path relative to ``cwd``, or a name on PATH)."""
    if os.sep in program:
        target = cwd / program
        return str(target) if target.is_file() and os.access(target, os.X_OK) else None
    return shutil.which(program, path=path)


def shown_env(command: CommandSpec, values: Mapping[str, object],
               arm_dir: Path) -> dict[str, str]:
    """The environment the case adds (no secrets), with the record API's folder."""
    shown = {k: fill(v, values) for k, v in command.env.items()}
    shown[METRICS_DIR_ENV] = str(Path(arm_dir).resolve() / METRICS_DIR)
    return shown


def arm_command(plan: CasePlan, arm: PlannedArm, arm_dir: Path, place: Rendezvous,
                device: Mapping[str, str], leg: Optional[str] = None) -> ArmCommand:
    """The command of ``arm`` writing into ``arm_dir``, its launcher's rendezvous at ``place``;
    ``device`` is added to the environment (``CUDA_VISIBLE_DEVICES`` for CPU ranks); ``leg``:
    which run of a ``-resumed`` arm (``save`` / ``load``, ``launch.ranks.command_resume``)."""
    command = plan.case.command
    assert command is not None
    values = placeholder_values(plan, arm, arm_dir, place)
    argv = arm_argv(command, arm.kind, arm.repeat, values, leg)
    cwd = command_cwd(plan, command)
    secrets = {k: os.environ[k] for k in command.secret_env if k in os.environ}
    env = {**device, **shown_env(command, values, arm_dir), **secrets}
    missing = [k for k in command.secret_env if k not in os.environ]
    problem = None
    if missing:
        problem = f"command.secret_env {', '.join(missing)} not set in the harness's environment"
    elif not cwd.is_dir():
        problem = f"command.cwd: no folder {cwd} (relative to the case file's folder)"
    elif find_program(argv[0], cwd, {**os.environ, **env}.get("PATH")) is None:
        problem = f"command not found: {argv[0]} (run from {cwd})"
    path = fill(source_path(command.metrics), {**values, "rank": "{rank}"})
    return ArmCommand(argv=tuple(argv), cwd=cwd, env=env,
                      secrets=tuple(v for v in secrets.values() if v), metrics_path=path,
                      problem=problem)


def record_environment(plan: CasePlan, arm_dir: Path, cmd: ArmCommand) -> None:
    """``<arm>/inherited_env.json``: what the arm's processes inherit from this environment
    (``harness.results.inherited_env``: secrets redacted) and what the case and the harness set
    on top (secret values left out)."""
    secret = plan.case.command.secret_env  # type: ignore[union-attr]
    write_arm_env(arm_dir, inherited(os.environ, secret),
                  {k: v for k, v in cmd.env.items() if k not in secret})


def prepare_metrics(plan: CasePlan, arm: PlannedArm, arm_dir: Path, path: str) -> int:
    """Before the command starts: remove what an earlier run left in its metrics source, make
    the record API's folder; where this run's lines begin in ``log.txt``."""
    spec = plan.case.command.metrics  # type: ignore[union-attr]
    for stale in stale_files(spec, arm_dir, path, arm.ranks):
        stale.unlink()
    (Path(arm_dir) / METRICS_DIR).mkdir(parents=True, exist_ok=True)
    log = Path(arm_dir) / LOG_FILE
    return log.stat().st_size if log.exists() else 0


def log_line(arm_dir: Path, line: str) -> None:
    """One ``[launcher]`` line in the arm's log."""
    with open(Path(arm_dir) / LOG_FILE, "a", encoding="utf-8") as log:
        log.write(f"[launcher] {line}\n")


def _platform(on_cuda: bool) -> str:
    if not on_cuda:
        return "cpu"
    import torch

    return platform_key(torch.cuda.get_device_name(0))


def run_command_arm(plan: CasePlan, arm: PlannedArm, arm_dir: Path, timeout_s: float, gpus: int,
                    repro: str, *, stack_wait_s: float = 3.0, kill_grace_s: float = 5.0
                    ) -> ArmOutcome:
    """Run arm ``arm`` of command case ``plan`` here and record its metrics (module doc); never
    raises for a failing arm."""
    arm_dir = Path(arm_dir)
    arm_dir.mkdir(parents=True, exist_ok=True)
    device, where = device_env(arm.world_size, gpus, plan.largest_arm.world_size)
    launcher = launcher_mode(plan)
    # A launcher's port is fixed before the start (its arguments may name it); per-rank
    # processes get theirs from run_ranks, which tries another when it is taken.
    place = Rendezvous(master_port=pick_free_port()) if launcher else Rendezvous()
    cmd = arm_command(plan, arm, arm_dir, place, device, resume_legs(arm)[0])
    if cmd.problem:
        return failed_outcome(arm, arm_dir, cmd.problem, repro)
    log_start = prepare_metrics(plan, arm, arm_dir, cmd.metrics_path)
    record_environment(plan, arm_dir, cmd)
    log_line(arm_dir, f"case {plan.case_id} arm {arm.name}: command case, {where}; "
                      f"{'one launcher per node' if launcher else 'one process per rank'}")
    spent: list[float] = []

    def run(leg: Optional[str]) -> ArmOutcome:
        # A launcher's port is fixed before each start (the runs of a resumed arm get one each);
        # the launchers of several nodes all start here, each as its node ({node_rank}).
        at = Rendezvous(master_port=pick_free_port()) if launcher else Rendezvous()
        leg_cmd = arm_command(plan, arm, arm_dir, at, device, leg)
        nodes = [dataclasses.replace(at, index=k) for k in range(starters(plan, arm))]
        done = run_ranks(RankCommand(
            argv=leg_cmd.argv, world_size=starters(plan, arm), arm_dir=arm_dir,
            timeout_s=max(timeout_s - sum(spent), 1.0), env=leg_cmd.env, repro=repro,
            cwd=leg_cmd.cwd, redact=leg_cmd.secrets, label=process_label(plan),
            rendezvous=rendezvous_env(plan, arm, at) if launcher else {},  # its port: fixed
            per_process={n.index: ProcessStart(arm_command(plan, arm, arm_dir, n, device,
                                                           leg).argv,
                                               rendezvous_env(plan, arm, n))
                         for n in (nodes if launcher else [])},
            variation=variation(arm.case.execution.vary_processes)),
            stack_wait_s=stack_wait_s, kill_grace_s=kill_grace_s)
        spent.append(done.wall_s)
        return done

    if arm.case.execution.interrupt_after is not None:  # compare.resume: two runs
        start = source_mark(plan.case.command.metrics, arm_dir,  # type: ignore[union-attr]
                            cmd.metrics_path, arm.ranks)
        legs, loaded = run_resumed(plan, arm, arm_dir, cmd.metrics_path, start, run,
                                   placeholder_values(plan, arm, arm_dir),
                                   lambda line: log_line(arm_dir, f"arm {arm.name}: {line}"))
        return record_resumed(plan, arm, arm_dir, legs, loaded, cmd.metrics_path,
                              on_cuda=not device, cmd=cmd)
    outcome = run(None)
    if not outcome.ok:
        return outcome
    return record_metrics(plan, arm, arm_dir, outcome, cmd.metrics_path, log_start,
                          on_cuda=not device, cmd=cmd)


def probed(plan: CasePlan, arm: PlannedArm, arm_dir: Path, cmd: Optional[ArmCommand],
           records: Mapping[int, Sequence[StepRecord]], on_cuda: bool
           ) -> Mapping[int, Sequence[StepRecord]]:
    """``records``, with the environment the command ran in where its metrics named none and a
    golden pair judges the arm (``launch.ranks.command_env``); the log says which, or why not."""
    if cmd is None or not needs_probe(plan, arm) or any(
            rec.environment is not None for recs in records.values() for rec in recs):
        return records
    env = {**os.environ, **cmd.env}
    program = find_program(cmd.argv[0], cmd.cwd, env.get("PATH"))
    found, why = probe_command(program, env, on_cuda, cmd.cwd)
    if found is None:
        log_line(arm_dir, f"arm {arm.name}: its metrics name no environment, and {why}")
        return records
    log_line(arm_dir, f"arm {arm.name}: its metrics name no environment; {program} under the "
                      f"command's environment runs {describe(found)}")
    return with_environment(records, found)


def record_resumed(plan: CasePlan, arm: PlannedArm, arm_dir: Path, legs: Sequence[Leg],
                   loaded: Checkpointed, path: str, on_cuda: bool,
                   cmd: Optional[ArmCommand] = None) -> ArmOutcome:
    """A ``-resumed`` arm's outcome from its runs (``launch.ranks.command_resume``): a run that
    failed is the arm's outcome (named), else its joined records in ``rank<k>.jsonl``."""
    wall = round(sum(leg.outcome.wall_s for leg in legs), 3)
    last = legs[-1].outcome
    if not last.ok:
        which = "first run (command.resume.save)" if len(legs) == 1 else \
            "second run (command.resume.load)"
        return dataclasses.replace(last, wall_s=wall, detail=f"its {which}: {last.detail}"
                                   if last.detail else f"its {which} failed")
    records, note = resumed_records(plan, arm, arm_dir, path, legs, loaded, _platform(on_cuda))
    if records is None:
        return failed_outcome(arm, arm_dir, note, last.repro, dataclasses.replace(last, wall_s=wall))
    write_records(arm_dir, probed(plan, arm, arm_dir, cmd, records, on_cuda))
    fewest = min((len(r) for r in records.values()), default=0)
    log_line(arm_dir, f"case {plan.case_id} arm {arm.name}: {note}")
    return ArmOutcome(status="ok", returncode=0, wall_s=wall, repro=last.repro,
                      restarts=last.restarts, detail=f"the command wrote {fewest} of "
                      f"{arm.case.train.steps} planned steps; {note}")


def record_metrics(plan: CasePlan, arm: PlannedArm, arm_dir: Path, outcome: ArmOutcome,
                   path: str, log_start: int, on_cuda: bool,
                   cmd: Optional[ArmCommand] = None) -> ArmOutcome:
    """The command's metrics (every process of it ended well: ``outcome``) into
    ``rank<k>.jsonl`` (with the environment ``cmd`` ran in where they name none:
    :func:`probed`); the arm's outcome says how many steps it wrote, or why it failed."""
    spec = plan.case.command.metrics  # type: ignore[union-attr]
    try:
        records = read_source(spec, arm_dir, arm.ranks, _platform(on_cuda), path=path,
                              log_start=log_start)
    except MetricsError as exc:
        return failed_outcome(arm, arm_dir, f"its metrics ({spec.source}) cannot be read: {exc}",
                              outcome.repro, outcome)
    records = probed(plan, arm, arm_dir, cmd, records, on_cuda)
    for rank, recs in records.items():
        writer = StepWriter(arm_dir, rank, resume=False)
        for rec in recs:
            writer.append(rec)
    steps = {rank: len(recs) for rank, recs in records.items()}
    fewest = min(steps.values(), default=0)
    if fewest == 0:
        return failed_outcome(arm, arm_dir, f"the command wrote no step to its metrics "
                                            f"({spec.source}, {path})", outcome.repro, outcome)
    note = f"the command wrote {fewest} of {arm.case.train.steps} planned steps"
    log_line(arm_dir, f"case {plan.case_id} arm {arm.name}: {note} ({spec.source}, {path})")
    detail = f"{note}; {outcome.detail}" if outcome.detail else note
    return ArmOutcome(status="ok", returncode=0, wall_s=outcome.wall_s, repro=outcome.repro,
                      restarts=outcome.restarts, detail=detail)


def failed_outcome(arm: PlannedArm, arm_dir: Path, why: str, repro: str,
                   ran: Optional[ArmOutcome] = None) -> ArmOutcome:
    """A failed arm's outcome (and its line in the log)."""
    log_line(arm_dir, f"arm '{arm.name}': {why}")
    return ArmOutcome(status="failed", returncode=ran.returncode if ran else None,
                      wall_s=ran.wall_s if ran else 0.0, log_tail=ran.log_tail if ran else "",
                      repro=repro, restarts=ran.restarts if ran else 0, detail=why)
