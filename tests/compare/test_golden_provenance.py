"""Where golden values came from, and what the golden check says about it (hand-made records; no
training): the file names the arm it was recorded from, and a check of another arm (the golden
arm moved) is an error naming both and the command that re-records; the environment the values
were recorded in (the records' settings such as ``NCCL_ALGO``, a command's inherited variables)
is compared with the run's, and a difference is in the check's detail."""

from __future__ import annotations

import dataclasses

import pytest

from harness.compare import CONTRACTS, Pair, recorded_differences
from harness.compare.contracts.golden import GoldenPairParams
from harness.golden import GoldenCopy, GoldenError, golden_from_document, golden_values

from tests.compare import scenarios as sc
from tests.compare.test_golden_bounds import HERE, cpu_run


def pair_of(doc: dict, arm: str = "eager") -> Pair:
    copy = GoldenCopy(path="golden/c1/golden_values_cpu.json", sha256="0" * 64, document=doc)
    return Pair("golden", "golden", (arm,),
                GoldenPairParams(case_id="c1", golden_dir="golden", steps=sc.STEPS,
                                 files={"cpu": copy}, deterministic_fp32=True))


def test_the_file_names_its_arm_and_a_moved_golden_arm_is_an_error_naming_both() -> None:
    run = cpu_run()
    doc = golden_values(run, arm="eager")
    assert {entry["arm"] for entry in doc.values()} == {"eager"}
    judged = CONTRACTS["golden"](pair_of(doc), {"eager": run})
    assert all(c.passed for c in judged)
    with pytest.raises(GoldenError) as moved:
        CONTRACTS["golden"](pair_of(doc, "graph"), {"graph": run})
    text = str(moved.value)
    assert ("the golden values were recorded from arm 'eager', but compare.golden.arm judges "
            "arm 'graph' (the golden arm moved)") in text
    assert "`dcp-harness golden record <sweep> --case c1 --platform cpu`" in text
    # A file recorded before the arm was kept names none: judged as before.
    old = golden_values(run)
    assert "arm" not in old["lm loss"]
    assert all(c.passed for c in CONTRACTS["golden"](pair_of(old, "graph"), {"graph": run}))


def test_a_file_whose_entries_name_two_arms_is_refused() -> None:
    doc = golden_values(cpu_run(), arm="eager")
    doc["grad norm"]["arm"] = "graph"
    with pytest.raises(GoldenError, match="one arm name for the whole file"):
        golden_from_document("g.json", doc)


def test_an_environment_difference_is_in_the_check_detail_and_named() -> None:
    recorded = dataclasses.replace(HERE, settings=(("NCCL_ALGO", "Ring"), ("OMP_NUM_THREADS", "2")))
    doc = golden_values(cpu_run(recorded), arm="eager",
                        inherited_env={"TRAINER_LR_SCALE": "1.5", "PATH": "/bin"})
    golden = golden_from_document("g.json", doc)
    assert golden.inherited_env == {"PATH": "/bin", "TRAINER_LR_SCALE": "1.5"}
    now = dataclasses.replace(HERE, settings=(("NCCL_ALGO", "Tree"), ("OMP_NUM_THREADS", "2")))
    run = cpu_run(now)
    assert recorded_differences(golden, run, {"PATH": "/bin"}) == [
        "NCCL_ALGO Ring -> Tree", "TRAINER_LR_SCALE=1.5 (golden) vs no TRAINER_LR_SCALE "
        "(this sweep)"]
    assert recorded_differences(golden, cpu_run(recorded), doc["lm loss"]["inherited_env"]) == []
    loss = {c.name: c for c in CONTRACTS["golden"](pair_of(doc), {"eager": run})}["loss"]
    assert loss.passed  # NCCL_ALGO picks no CPU kernel: still bitwise, and it repeats
    assert loss.detail.endswith("; recorded in another environment: NCCL_ALGO Ring -> Tree")
    same = {c.name: c for c in CONTRACTS["golden"](pair_of(doc), {"eager": cpu_run(recorded)})}
    assert "another environment" not in same["loss"].detail


def test_a_metric_logged_at_some_steps_only_is_held_to_those_steps() -> None:
    """A command's memory lines come at the iterations it logs them (the example trainer: after
    iterations 1 and 2 of 4): its golden series ends before the case's last step, and that is
    no changed train.steps; one that runs past the case's last step still is."""
    from harness.golden import covered

    golden = golden_from_document("g.json", {"lm loss": {"values": {"1": 1.0}},
                                             "mem-allocated-bytes": {"values": {"1": 5.0, "2": 5.0}}})
    assert covered(golden, "mem-allocated-bytes", {1: 5.0, 2: 5.0}, "eager", 4) == {1: 5.0, 2: 5.0}
    with pytest.raises(GoldenError, match="runs to step 2, the case to train.steps 4"):
        covered(golden, "mem-allocated-bytes", {1: 5.0, 2: 5.0, 4: 5.0}, "eager", 4)
    with pytest.raises(GoldenError, match="runs to step 2, the case to train.steps 1"):
        covered(golden, "mem-allocated-bytes", {1: 5.0}, "eager", 1)
