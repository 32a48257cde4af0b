"""The one repro line (harness.launch.ranks.repro): every launcher puts the same line in an arm's outcome,
and a built-in arm's line names a case file and arm that ``python -m harness.launch.local`` reads
(the command case's line is run for real in test_command.py)."""

from __future__ import annotations

import shlex
import subprocess

from harness.launch.ranks.repro import REPO_ROOT, REPRO_ROOT, repro_line
from harness.launch.slurm.collect import outcomes_for_ended_job
from harness.launch.slurm.poll import query_scheduler
from harness.results import CASE_FILE

from tests.launch.slurm_fakes import Scheduler


def test_a_built_in_arm_is_re_run_by_the_local_entry_point_into_a_fresh_folder(sweep):
    out, plan, _ = sweep
    line = repro_line(plan, plan.arm("eager-repeat"), out / "t" / CASE_FILE, python="python3")
    assert line == (f"cd {shlex.quote(str(REPO_ROOT))} && python3 -m harness.launch.local --case "
                    f"{shlex.quote(str((out / 't' / CASE_FILE).resolve()))} --arm eager-repeat "
                    f"--out {REPRO_ROOT / 't' / 'eager-repeat'}")


def test_the_built_in_line_names_a_case_and_arm_the_entry_point_reads(sweep):
    out, plan, _ = sweep
    line = repro_line(plan, plan.arm("eager"), out / "t" / CASE_FILE)
    # A bad --timeout-min is refused only after the case file and the arm were read.
    done = subprocess.run(["bash", "-c", f"{line} --timeout-min -1"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "--timeout-min must be a positive number" in done.stderr, done.stderr


def test_collect_gives_an_arm_it_classifies_the_line_the_local_launcher_gives(sweep):
    out, plan, ref = sweep
    view = query_scheduler(["41"], Scheduler(squeue="41|FAILED|NonZeroExitCode\n"))
    outs = outcomes_for_ended_job(out / "t", ref, view.get("41"))
    for arm in plan.arms:
        assert outs[arm.name].repro == repro_line(plan, arm, out / "t" / CASE_FILE)
