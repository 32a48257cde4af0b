"""compare.resume on CPU: the launcher stops the ``-resumed`` arm after its step (its processes
exit), starts it again from the checkpoint, and the verdict checks it matches the uninterrupted
arm bitwise after the stop; a resume that loses the optimizer state is caught."""

import json

import pytest

from harness.arms import plan_case
from harness.cli import main
from harness.compare import evaluate_case
from harness.launch.ranks import rank_main
from harness.results import ArmOutcome, read_outcome, read_steps
from harness.spec.loader import load_cases


def test_an_interrupted_arm_resumes_bitwise(write_case, tmp_path):
    case = write_case("res", train={"steps": 4}, compare={"resume": {}})
    out = tmp_path / "out"
    assert main(["run", str(case), "--out", str(out)]) == 0
    verdict = json.loads((out / "res" / "verdict.json").read_text())
    (entry,) = [p for p in verdict["pairs"] if p["pair"] == "resume"]
    assert entry["status"] == "pass" and entry["arms"] == ["eager-resumed", "eager"]
    checks = {c["name"]: c for c in entry["checks"]}
    assert checks["resumed_after"]["passed"] and checks["loss"]["value"] == 0
    assert "bitwise equal over 2 steps" in checks["loss"]["detail"]
    resumed = read_steps(out / "res" / "eager-resumed")[0]
    assert [r.resumed_from for r in resumed] == [None, None, 2, 2]
    # and, by the checkpoint's own metadata, the checkpoint it loaded holds step 2
    assert [r.checkpoint_step for r in resumed] == [None, None, 2, 2]
    assert checks["loaded_checkpoint"]["passed"]
    # the optimizer and RNG state after the load are the ones at the stop
    assert checks["optimizer_state"]["passed"] and checks["rng_state"]["passed"]
    assert [r.stop_state is not None for r in resumed] == [False, True, False, False]
    assert [r.loaded_state is not None for r in resumed] == [False, False, True, False]
    assert resumed[1].stop_state == resumed[2].loaded_state
    # each process recorded its environment once: the first leg on step 1, the second on step 3
    assert [r.environment is not None for r in resumed] == [True, False, True, False]
    log = (out / "res" / "eager-resumed" / "log.txt").read_text()
    assert "stopping its ranks after step 2 (compare.resume)" in log
    assert "stopped after step 2 as planned" in log
    outcome = read_outcome(out / "res" / "eager-resumed")
    assert outcome.ok and "stopped by the harness after step 2 and resumed" in outcome.detail
    # The uninterrupted arm never resumed.
    assert all(r.resumed_from is None for r in read_steps(out / "res" / "eager")[0])


def _up_to_the_stop(write_case, tmp_path, monkeypatch, name):
    """A 4-step case with compare.resume: its eager arm run whole and its resumed arm's first leg
    (stopped after step 2), both in this process (run_rank, what every launcher runs per rank)."""
    case = write_case(name, train={"steps": 4}, compare={"resume": {}})
    plan = plan_case(load_cases([case])[0])
    arms = {a.name: a for a in plan.arms}
    out = tmp_path / name
    monkeypatch.delenv("RANK", raising=False)
    rank_main.run_rank(arms["eager"], out / "eager")
    legs = rank_main.arm_legs(arms["eager-resumed"])
    assert legs == (2, None)
    rank_main.run_rank(arms["eager-resumed"], out / "eager-resumed", stop_after=legs[0])
    return plan, arms, out


def test_a_resume_that_loses_the_optimizer_state_fails(write_case, tmp_path, monkeypatch):
    """Both legs in this process (run_rank, the function every launcher runs per rank), the
    second with a restore that keeps the model but starts a fresh optimizer."""
    import harness.workload.train as train

    plan, arms, out = _up_to_the_stop(write_case, tmp_path, monkeypatch, "lost")
    real = train._restore

    def forgetful(s, opt, state, case, rank, where):
        real(s, opt, state, case, rank, where)
        opt.state.clear()  # the optimizer state lost on resume

    monkeypatch.setattr(train, "_restore", forgetful)
    rank_main.run_rank(arms["eager-resumed"], out / "eager-resumed")
    ok = ArmOutcome(status="ok", returncode=0)
    data = {a: (ok, read_steps(out / a)) for a in ("eager", "eager-resumed")}
    v = evaluate_case("lost", plan.pairs, data, expected_steps=4,
                      expected_ranks=plan.expected_ranks)
    (entry,) = [p for p in v.pairs if p.pair == "resume"]
    failed = [c.name for c in entry.failed_checks]
    # It really stopped and resumed after step 2, and the steps before match: only after it differs.
    assert entry.status == "fail" and "loss" in failed
    assert "loss_before_stop" not in failed and "resumed_after" not in failed
    # and, independently of the losses, the optimizer state the resumed process got is not the
    # one it stopped with (its RNG is)
    assert "optimizer_state" in failed and "rng_state" not in failed
    (opt_check,) = [c for c in entry.checks if c.name == "optimizer_state"]
    assert "rank 0: optimizer state" in opt_check.detail and "after the load" in opt_check.detail


def test_a_resume_that_leaves_the_rng_where_the_fresh_process_put_it_fails(write_case, tmp_path,
                                                                           monkeypatch):
    """The RNG not restored: the losses cannot see it (the model draws no random numbers while it
    trains), the rng_state check does."""
    import torch

    import harness.workload.train as train

    plan, arms, out = _up_to_the_stop(write_case, tmp_path, monkeypatch, "rng")
    torch.manual_seed(99)  # where this test's process left the generator: not the stop's state
    monkeypatch.setattr(train, "restore_rng", lambda state, device: None)
    monkeypatch.setattr(train, "_determinism", _seeded_elsewhere(train._determinism))
    rank_main.run_rank(arms["eager-resumed"], out / "eager-resumed")
    ok = ArmOutcome(status="ok", returncode=0)
    data = {a: (ok, read_steps(out / a)) for a in ("eager", "eager-resumed")}
    v = evaluate_case("rng", plan.pairs, data, expected_steps=4, expected_ranks=plan.expected_ranks)
    (entry,) = [p for p in v.pairs if p.pair == "resume"]
    failed = [c.name for c in entry.failed_checks]
    assert failed == ["rng_state"], failed


def _seeded_elsewhere(real):
    """``train._determinism`` that seeds the generator with another seed (a fresh process whose
    generator is not the one the checkpoint's stop had)."""
    from contextlib import contextmanager

    @contextmanager
    def seeded(enabled, seed):
        with real(enabled, seed + 1):
            yield
    return seeded


def test_preflight_refuses_a_stop_outside_the_run(write_case, capsys):
    case = write_case("late", train={"steps": 4}, compare={"resume": {"at_step": 4}})
    assert main(["validate", str(case)]) == 2
    err = capsys.readouterr().err
    assert "field 'compare.resume.at_step'" in err and "1 <= at_step < 4" in err


@pytest.mark.parametrize("resume, names", [
    ({}, ["eager-resumed"]),
    ({"arms": ["eager", "eager-repeat"]}, ["eager-resumed", "eager-repeat-resumed"]),
])
def test_the_planner_derives_one_resumed_arm_per_arm(write_case, resume, names):
    compare = {"resume": resume, "repeat": {}}
    plan = plan_case(load_cases([write_case("p", train={"steps": 6}, compare=compare)])[0])
    pairs = [p for p in plan.pairs if p.contract == "resume"]
    assert [p.arms[0] for p in pairs] == names
    assert [p.name for p in pairs] == ["resume", "resume-eager-repeat"][:len(names)]
    for name in names:
        arm = plan.arm(name)
        assert arm.case.execution.interrupt_after == 3 and arm.kind == "eager"
        assert rank_main.arm_legs(arm) == (3, None)
    assert rank_main.arm_legs(plan.arm("eager")) == (None,)
