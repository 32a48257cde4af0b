"""When an arm is done (harness.launch.ranks.completion): the one rule of the local sweep, emulated ranks,
a Slurm job, ``status`` and ``collect``."""

from __future__ import annotations

import pytest

from harness.arms import plan_case
from harness.launch.ranks.completion import arm_is_complete, arm_needs_run, rank_is_complete
from harness.launch.sweep_folder import prepare_case_dir
from harness.results import ArmOutcome, write_outcome
from tests.launch.cases import REPEAT, load_case_file
from tests.launch.slurm_fakes import steps


@pytest.fixture
def two_ranks(tmp_path):
    """(plan, case folder) of a two-rank case of 3 steps with a repeat arm."""
    plan = plan_case(load_case_file(tmp_path, "two", compare=REPEAT,
                                    resources={"gpus_per_node": 2}))
    return plan, prepare_case_dir(plan, tmp_path / "sweep")


def test_an_arm_is_complete_with_an_ok_outcome_and_every_step_on_every_rank(two_ranks):
    plan, case_dir = two_ranks
    arm, arm_dir = plan.arm("eager"), case_dir / "eager"
    assert arm.ranks == (0, 1)
    steps(arm_dir, 3, rank=0)
    steps(arm_dir, 2, rank=1)
    write_outcome(arm_dir, ArmOutcome(status="ok", returncode=0))
    assert rank_is_complete(arm, arm_dir, 0) and not rank_is_complete(arm, arm_dir, 1)
    assert not arm_is_complete(arm, arm_dir)  # ok, but rank 1 lacks step 3
    assert arm_needs_run(arm, arm_dir, retry_final=False)
    steps(arm_dir, 3, rank=1)
    assert arm_is_complete(arm, arm_dir)
    assert not arm_needs_run(arm, arm_dir, retry_final=True)
    write_outcome(arm_dir, ArmOutcome(status="infra"))  # every step, but the arm did not end well
    assert not arm_is_complete(arm, arm_dir)


@pytest.mark.parametrize("status, in_job, again", [
    # a requeued job, status and collect keep a final outcome; a new local run retries it
    ("failed", False, True), ("timeout", False, True), ("skipped", False, True),
    ("infra", True, True), ("ok", True, True),  # "ok" without its steps runs again
])
def test_a_final_outcome_stands_unless_final_outcomes_are_retried(two_ranks, status, in_job,
                                                                   again):
    plan, case_dir = two_ranks
    arm, arm_dir = plan.arm("eager"), case_dir / "eager"
    assert arm_needs_run(arm, arm_dir, retry_final=False)  # no outcome yet
    write_outcome(arm_dir, ArmOutcome(status=status))
    assert arm_needs_run(arm, arm_dir, retry_final=False) is in_job
    assert arm_needs_run(arm, arm_dir, retry_final=True) is again
