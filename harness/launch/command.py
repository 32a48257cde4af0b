"""Run one arm of a command case (``command:``): the case's training command in place of the
built-in workload, then its metrics read into ``<arm>/rank<k>.jsonl``.

The arm's argument vector is ``command.argv`` plus its role's arguments, placeholders filled
(``harness.spec.command``); it starts in ``command.cwd`` (relative to the case file's folder).
``ranks: per_rank`` starts one process per rank with RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT set (``local.run_ranks``, the same process handling as the built-in ranks: output to
``log.txt`` prefixed ``[rank k]``, time limit, stacks, clean-up); ``ranks: launcher`` starts one
process per node (a launcher such as torchrun) with NNODES / NODE_RANK / NPROC_PER_NODE and
MASTER_ADDR / MASTER_PORT set. ``command.env`` is added to the environment and ``secret_env``
is passed from the harness's own environment: its values are never written (not in the log,
the repro line, ``case.json`` or ``plan.json``, which hold only the names). The command also sees
``DCP_HARNESS_METRICS_DIR`` (``<arm>/metrics``, where ``harness.metrics.StepRecorder`` writes).

Once the ranks exit 0 the metrics source is read (``harness.metrics.read_source``) and each
rank's records are written to ``rank<k>.jsonl``. A command that is not found, exits non-zero,
writes no metrics or metrics that cannot be read fails the arm with the reason naming the arm;
fewer steps than planned or NaN are the arm checks' FAIL (``steps_complete``, ``no_nan_inf``).
The repro line is the command itself.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path
from typing import Mapping, Optional

from harness.caseplan import CasePlan, PlannedArm
from harness.golden import platform_key
from harness.launch.local import RankCommand, device_env, run_ranks
from harness.metrics import (METRICS_DIR_ENV, MetricsError, read_source, source_path,
                             stale_files)
from harness.results import LOG_FILE, ArmOutcome, StepWriter
from harness.spec.command import FIXED_CP_ROLES, arm_argv, fill
from harness.spec.schema import CommandSpec, MetricsSource, RankStart

METRICS_DIR = "metrics"


def placeholder_values(plan: CasePlan, arm: PlannedArm, arm_dir: Path) -> dict[str, object]:
    """What the placeholders of ``harness.spec.command.PLACEHOLDERS`` stand for in this arm."""
    case = arm.case
    values: dict[str, object] = {
        "arm_dir": Path(arm_dir).resolve(), "steps": case.train.steps,
        "world_size": arm.world_size, "seed": case.train.seed,
        "case_dir": Path(plan.source).parent, "nnodes": case.resources.nodes,
        "nproc_per_node": case.resources.gpus_per_node}
    if arm.kind in FIXED_CP_ROLES:
        values["fixed_cp"] = case.layout.max_cp
    return values


def command_cwd(plan: CasePlan, command: CommandSpec) -> Path:
    """Where the command starts: ``command.cwd`` relative to the case file's folder."""
    base = Path(plan.source).parent
    return (base / command.cwd).resolve() if command.cwd else base


def find_program(program: str, cwd: Path, path: Optional[str]) -> Optional[str]:
    """The executable ``program`` names (a path relative to ``cwd``, or a name on PATH)."""
    if os.sep in program:
        target = cwd / program
        return str(target) if target.is_file() and os.access(target, os.X_OK) else None
    return shutil.which(program, path=path)


def repro_line(cwd: Path, env: Mapping[str, str], argv: list[str]) -> str:
    """The command itself, as one shell line (secret variables left to the caller's shell)."""
    assigns = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return f"cd {shlex.quote(str(cwd))} && " + " ".join(assigns + [shlex.join(argv)])


def _log(arm_dir: Path, line: str) -> None:
    with open(Path(arm_dir) / LOG_FILE, "a", encoding="utf-8") as log:
        log.write(f"[launcher] {line}\n")


def _platform(on_cuda: bool) -> str:
    if not on_cuda:
        return "cpu"
    import torch

    return platform_key(torch.cuda.get_device_name(0))


def _environment(command: CommandSpec, values: Mapping[str, object], arm_dir: Path,
                 device: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(the environment added, its shown part, secret names missing from the harness's own)."""
    shown = {k: fill(v, values) for k, v in command.env.items()}
    shown[METRICS_DIR_ENV] = str(Path(arm_dir).resolve() / METRICS_DIR)
    missing = [k for k in command.secret_env if k not in os.environ]
    secrets = {k: os.environ[k] for k in command.secret_env if k in os.environ}
    return {**device, **shown, **secrets}, shown, missing


def run_command_arm(plan: CasePlan, arm: PlannedArm, arm_dir: Path, timeout_s: float, gpus: int,
                    *, stack_wait_s: float = 3.0, kill_grace_s: float = 5.0) -> ArmOutcome:
    """Run arm ``arm`` of command case ``plan`` here and record its metrics (module doc); never
    raises for a failing arm."""
    command = plan.case.command
    assert command is not None
    arm_dir = Path(arm_dir)
    arm_dir.mkdir(parents=True, exist_ok=True)
    values = placeholder_values(plan, arm, arm_dir)
    argv = arm_argv(command, arm.kind, arm.repeat, values)
    cwd = command_cwd(plan, command)
    device, where = device_env(arm.world_size, gpus, plan.largest_arm.world_size)
    env, shown, missing = _environment(command, values, arm_dir, device)
    repro = repro_line(cwd, shown, argv)
    if missing:
        return _failed(arm, arm_dir, f"command.secret_env {', '.join(missing)} not set in the "
                                     "harness's environment", repro)
    program = find_program(argv[0], cwd, {**os.environ, **env}.get("PATH"))
    if program is None:
        return _failed(arm, arm_dir, f"command not found: {argv[0]} (run from {cwd})", repro)
    spec = command.metrics
    path = fill(source_path(spec), {**values, "rank": "{rank}"})
    for stale in stale_files(spec, arm_dir, path, arm.ranks):
        stale.unlink()
    (arm_dir / METRICS_DIR).mkdir(exist_ok=True)
    log_start = (arm_dir / LOG_FILE).stat().st_size if (arm_dir / LOG_FILE).exists() else 0
    per_rank = command.ranks is RankStart.PER_RANK
    _log(arm_dir, f"case {plan.case_id} arm {arm.name}: command case, {where}; "
                  f"{'one process per rank' if per_rank else 'one launcher per node'}")
    if not per_rank:
        env.update(NNODES=str(values["nnodes"]), NODE_RANK="0",
                   NPROC_PER_NODE=str(values["nproc_per_node"]))
    outcome = run_ranks(RankCommand(argv=tuple(argv), world_size=arm.world_size if per_rank else 1,
                                    arm_dir=arm_dir, timeout_s=timeout_s, env=env, repro=repro,
                                    cwd=cwd),
                        stack_wait_s=stack_wait_s, kill_grace_s=kill_grace_s)
    if not outcome.ok:
        return outcome
    return _record(plan, arm, arm_dir, outcome, path, log_start, on_cuda=not device)


def _record(plan: CasePlan, arm: PlannedArm, arm_dir: Path, outcome: ArmOutcome, path: str,
            log_start: int, on_cuda: bool) -> ArmOutcome:
    """The command's metrics into ``rank<k>.jsonl``; the outcome says how many steps it wrote."""
    spec = plan.case.command.metrics  # type: ignore[union-attr]
    try:
        records = read_source(spec, arm_dir, arm.ranks, _platform(on_cuda), path=path,
                              log_start=log_start if spec.source is MetricsSource.MEGATRON_LOG
                              else 0)
    except MetricsError as exc:
        return _failed(arm, arm_dir, f"its metrics ({spec.source}) cannot be read: {exc}",
                       outcome.repro, outcome)
    for rank, recs in records.items():
        writer = StepWriter(arm_dir, rank, resume=False)
        for rec in recs:
            writer.append(rec)
    steps = {rank: len(recs) for rank, recs in records.items()}
    fewest = min(steps.values(), default=0)
    if fewest == 0:
        return _failed(arm, arm_dir, f"the command wrote no step to its metrics ({spec.source}, "
                                     f"{path})", outcome.repro, outcome)
    note = f"the command wrote {fewest} of {arm.case.train.steps} planned steps"
    _log(arm_dir, f"case {plan.case_id} arm {arm.name}: {note} ({spec.source}, {path})")
    return ArmOutcome(status="ok", returncode=0, wall_s=outcome.wall_s, repro=outcome.repro,
                      restarts=outcome.restarts, detail=note)


def _failed(arm: PlannedArm, arm_dir: Path, why: str, repro: str,
            ran: Optional[ArmOutcome] = None) -> ArmOutcome:
    _log(arm_dir, f"arm '{arm.name}': {why}")
    return ArmOutcome(status="failed", returncode=ran.returncode if ran else None,
                      wall_s=ran.wall_s if ran else 0.0, log_tail=ran.log_tail if ran else "",
                      repro=repro, restarts=ran.restarts if ran else 0, detail=why)
