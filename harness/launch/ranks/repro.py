"""The repro line: one shell line that re-runs just one arm on this machine, into a fresh folder
under ``/tmp/dcp-repro/<case id>/<arm>``. Every launcher (local ranks, emulated ranks, a Slurm
job and ``collect``) puts this one line in the arm's outcome.

* A built-in arm (real or emulated ranks): ``cd <repository> && <python> -m
  harness.launch.local --case <case.json> --arm <arm> --out /tmp/dcp-repro/<case>/<arm>``.
* A command arm (``command:``): the command itself, every process of it on this machine with the
  variables it inherited (``<arm>/inherited_env.json`` once the arm ran, else this environment:
  ``harness.results.inherited_env``) and those the harness sets (rendezvous on 127.0.0.1:29500;
  secret ones left to the caller's shell) and the arm's device settings (``CUDA_VISIBLE_DEVICES``
  as the arm ran: what the harness set, e.g. empty for CPU ranks; none where the arm kept
  what it inherited),
  ``{arm_dir}`` in ``/tmp/dcp-repro``, removed first (a fresh folder: no log, event file or
  checkpoint of an earlier run is read or loaded); the launchers of a case of several nodes each
  as its node (``NODE_RANK`` and ``{node_rank}`` the loop's ``$k``); for a ``-resumed`` arm both
  runs, the second (``command.resume.load``) only after every process of the first
  (``command.resume.save``) succeeded.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Mapping

from harness.caseplan import CasePlan, PlannedArm
from harness.launch.ranks.command import (METRICS_DIR, Rendezvous, command_cwd, launcher_mode,
                                          placeholder_values, rendezvous_env, shown_env,
                                          starters)
from harness.launch.ranks.command_resume import resume_legs
from harness.launch.ranks.processes import REPO_ROOT, cuda_device_count, device_env
from harness.results import inherited, read_arm_env, read_arm_set_env, replayable
from harness.spec.command import arm_argv

REPRO_ROOT = Path("/tmp/dcp-repro")
DEVICES = "CUDA_VISIBLE_DEVICES"
_EACH_NODE = "\0node_rank\0"  # stands for the loop's $k in a command line of several launchers


def repro_dir(case_id: str, arm: str) -> Path:
    """Where a repro line writes the arm."""
    return REPRO_ROOT / case_id / arm


def repro_line(plan: CasePlan, arm: PlannedArm, case_json: Path,
               python: str = sys.executable) -> str:
    """The line that re-runs ``arm`` of ``plan`` (whose ``case.json`` is ``case_json``) on its
    own (module doc)."""
    if plan.case.command is not None:
        arm_dir = Path(case_json).parent / arm.name
        recorded = read_arm_env(arm_dir)
        return _command_line(plan, arm, recorded if recorded is not None else inherited(
            os.environ, plan.case.command.secret_env), device_settings(plan, arm, arm_dir))
    argv = [python, "-m", "harness.launch.local", "--case", str(Path(case_json).resolve()),
            "--arm", arm.name, "--out", str(repro_dir(plan.case_id, arm.name))]
    return f"cd {shlex.quote(str(REPO_ROOT))} && {shlex.join(argv)}"


def _quote(arg: str) -> str:
    """``arg`` for the shell, a launcher's ``{node_rank}`` in it as ``"$k"``."""
    if _EACH_NODE not in arg:
        return shlex.quote(arg)
    return '"$k"'.join(shlex.quote(part) if part else "" for part in arg.split(_EACH_NODE))


def device_settings(plan: CasePlan, arm: PlannedArm, arm_dir: Path) -> dict[str, str]:
    """The arm's ``CUDA_VISIBLE_DEVICES`` as it ran: what its ``inherited_env.json`` says was
    set on top (the harness sets it empty for CPU ranks; nothing where the arm kept the one it
    inherited, as a Slurm task keeps Slurm's); before the arm ran, what the launcher here would
    set (``device_env``) or this environment's."""
    done = read_arm_set_env(arm_dir)
    if done is not None:  # as it ran: what the harness set, else what it inherited (Slurm's own)
        return {DEVICES: done[DEVICES]} if DEVICES in done else {}
    device, _ = device_env(arm.world_size, cuda_device_count(), plan.largest_arm.world_size)
    if DEVICES in device:
        return {DEVICES: device[DEVICES]}
    return {DEVICES: os.environ[DEVICES]} if DEVICES in os.environ else {}


def _command_line(plan: CasePlan, arm: PlannedArm, recorded: Mapping[str, str],
                  devices: Mapping[str, str]) -> str:
    command = plan.case.command
    assert command is not None
    arm_dir = repro_dir(plan.case_id, arm.name)
    values = placeholder_values(plan, arm, arm_dir)
    count = starters(plan, arm)
    if launcher_mode(plan) and count > 1:  # each launcher its own node: {node_rank} is $k
        values["node_rank"] = _EACH_NODE
    set_here = {**devices, **rendezvous_env(plan, arm, Rendezvous()),
                **shown_env(command, values, arm_dir)}
    env = {**set_here, **replayable(recorded, set(set_here) | set(command.secret_env))}
    if not launcher_mode(plan):
        env["LOCAL_WORLD_SIZE"] = str(count)  # every rank on this machine
    per_process = ("NODE_RANK", "PET_NODE_RANK") if launcher_mode(plan) else ("RANK", "LOCAL_RANK")
    head = (f"rm -rf {shlex.quote(str(arm_dir))} && "
            f"mkdir -p {shlex.quote(str(arm_dir / METRICS_DIR))} && "
            f"cd {shlex.quote(str(command_cwd(plan, command)))} && ")
    runs = [" ".join(map(_quote, arm_argv(command, arm.kind, arm.repeat, values, leg)))
            for leg in resume_legs(arm)]
    if count == 1:
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        return head + " && ".join(f"{assigns} {run}" for run in runs)
    assigns = " ".join(f"{k}={'$k' if k in per_process else shlex.quote(v)}"
                       for k, v in env.items())
    ranks = " ".join(map(str, range(count)))
    # every process waited for by its pid: the run fails when any of them did (a bare ``wait``
    # returns 0), so a resumed arm's second run starts only after the first succeeded
    return head + " && ".join(
        f"{{ pids=; for k in {ranks}; do {assigns} {run} & pids=\"$pids $!\"; done; ok=0; "
        f"for p in $pids; do wait \"$p\" || ok=1; done; [ \"$ok\" = 0 ]; }}" for run in runs)
