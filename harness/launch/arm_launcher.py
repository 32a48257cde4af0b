"""The one launcher interface: how the sweep and a Slurm job's task run an arm.

An :class:`ArmLauncher` runs one planned arm into its folder and says how it ended. The arm's
workload (the built-in training, or a case's ``command:``) plugs in behind it; the caller decides
*which* arms run (``completion.arm_needs_run``) and puts nothing else between. One implementation
per place an arm runs:

* ``local.launcher.LocalLauncher``: this machine's rank processes (``run``, ``golden record``, the repro
  entry point ``python -m harness.launch.local``); an emulated arm through
  ``emulated.EmulatedLauncher``, a command arm through ``command.run_command_arm``.
* ``emulated.EmulatedLauncher``: each emulated rank alone on a GPU (or the CPU), for this machine
  and for a Slurm job's task alike.
* ``slurm.job.TaskLauncher``: one task of a Slurm job: its rank's (or process's) share of the arm,
  or sitting the arm out; the arm's outcome as this task knows it.

Every one puts ``repro.repro_line`` in the outcome. The local sweep (``local.lanes.run_arm_into``) and a
Slurm job (``slurm.job.run_case_arms``) call ``run_arm`` alike; they differ in what they do around
it: the sweep records an exception as an ``infra`` outcome and keeps sweeping, a job's task lets it
end the job (srun stops the other tasks; the requeue or ``collect`` takes over).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from harness.caseplan import CasePlan, PlannedArm
from harness.results import ArmOutcome


class ArmLauncher(Protocol):
    """Runs every rank of one planned arm (its share, for a Slurm task) into ``arm_dir`` and
    reports how it ended. ``plan`` is the arm's case plan (every arm of a case runs on one kind of
    device); ``case_json`` the case's ``case.json`` (the ranks read it and ``plan.json`` beside
    it)."""

    def run_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
                case_json: Path) -> ArmOutcome: ...
