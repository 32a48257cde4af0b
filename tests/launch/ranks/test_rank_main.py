import json

import pytest

from harness.launch.ranks.rank_main import first_slurm_host, resolve_rank_env, step_line
from harness.results import StepRecord

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_torchrun_variables_used_as_given():
    env = resolve_rank_env({**TORCHRUN, "SLURM_PROCID": "7"}, world_size=2)
    assert env == TORCHRUN


def test_rank_without_master_is_an_error():
    with pytest.raises(RuntimeError, match="MASTER_PORT"):
        resolve_rank_env({k: v for k, v in TORCHRUN.items() if k != "MASTER_PORT"}, world_size=2)


def test_world_size_must_match_case():
    with pytest.raises(RuntimeError, match="needs 4 ranks"):
        resolve_rank_env(TORCHRUN, world_size=4)


def test_slurm_variables_when_rank_absent():
    environ = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3",
               "SLURM_JOB_NODELIST": "gpu[007-008]", "SLURM_JOB_ID": "123456",
               "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    env = resolve_rank_env(environ, world_size=8)
    assert env == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3",
                   "MASTER_ADDR": "gpu007", "MASTER_PORT": str(15000 + 123456 % 17000)}
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_slurm_derived_ports_stay_below_the_ephemeral_range():
    # Linux hands out 32768-60999 to outgoing connections: a rendezvous port there can be taken.
    ports = {int(resolve_rank_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
                                   "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_ID": str(job)},
                                  world_size=1)["MASTER_PORT"])
             for job in range(17000, 40000, 7)}
    assert min(ports) >= 1024 and max(ports) < 32768


def test_slurm_master_from_environment_wins():
    environ = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
               "SLURM_JOB_NODELIST": "n1", "MASTER_ADDR": "head", "MASTER_PORT": "4000"}
    env = resolve_rank_env(environ, world_size=2)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("head", "4000")


def test_single_rank_runs_without_any_variable():
    env = resolve_rank_env({}, world_size=1)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("0", "1", "0")
    assert int(env["MASTER_PORT"]) > 0


def test_multi_rank_without_variables_says_how_to_launch():
    with pytest.raises(RuntimeError, match="harness.launch.local"):
        resolve_rank_env({}, world_size=2)


@pytest.mark.parametrize("nodelist, first", [
    ("node1", "node1"),
    ("node1,node2", "node1"),
    ("gpu[003-010,012],cpu1", "gpu003"),
    ("rack[1-2]-n[5-6]", "rack1-n[5-6]"),
    ("a[12,3]", "a12"),
])
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


def test_step_line_is_one_readable_line():
    line = step_line("eager", 0, 4, StepRecord(step=2, loss=5.25, aux_loss=0.01, grad_norm=float("nan"),
                                               tokens=512, cp_sizes=(1, 1), step_time_s=0.12,
                                               max_allocated_bytes=None, nan=True, skipped=False))
    assert "\n" not in line
    assert line == ("[eager r0] step 2/4 loss 5.250000 aux 0.01 gnorm nan tokens 512 cp [1, 1] "
                    "0.120s NAN")


def test_records_name_the_platform_they_ran_on(tmp_path):
    from harness.launch.ranks.rank_main import _step_callback, device_platform
    from harness.results import StepRecord, StepWriter, read_steps

    assert device_platform("cpu") == "cpu"
    writer = StepWriter(tmp_path, 0)
    on_step = _step_callback(writer, 0, "eager", 2, platform="h200")
    on_step(StepRecord(step=1, loss=2.0, grad_norm=1.0, device="cuda:0"))
    (rec,) = read_steps(tmp_path)[0]
    assert rec.platform == "h200" and rec.device == "cuda:0"


@pytest.mark.cuda
def test_a_cuda_device_is_named_by_its_gpu_generation():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from harness.golden import platform_key
    from harness.launch.ranks.rank_main import device_platform

    name = torch.cuda.get_device_name(0)
    key = device_platform("cuda:0")
    assert key == platform_key(name) and key.isalnum(), (name, key)
    if "H200" in name:
        assert key == "h200"


def test_each_leg_of_a_rank_writes_its_phase_marks(write_case, tmp_path, monkeypatch):
    """The two legs of an interrupted arm, both in this process (as a Slurm task runs them):
    one leg each in phases.rank0.json, its marks in the order they happen."""
    from harness.arms import plan_case
    from harness.launch.ranks import rank_main
    from harness.results.phases import read_phases
    from harness.results.timing import arm_timing, checkpoint_rule
    from harness.spec.loader import load_cases

    plan = plan_case(load_cases([write_case("marks", train={"steps": 4},
                                            compare={"resume": {}})])[0])
    arm = plan.arm("eager-resumed")
    out = tmp_path / "eager-resumed"
    monkeypatch.delenv("RANK", raising=False)
    for stop in rank_main.arm_legs(arm):
        rank_main.run_rank(arm, out, stop_after=stop)
    first, second = read_phases(out, 0).legs
    assert (first.stop_after, second.stop_after) == (2, None)
    assert [m.step for m in first.steps] == [1, 2] and [m.step for m in second.steps] == [3, 4]
    for leg in (first, second):
        assert leg.device == "cpu" and leg.main_at is None  # run_rank called, not main()
        order = [leg.entered_at, leg.imported_at, leg.rendezvous_at, leg.build_started_at,
                 leg.built_at, leg.steps[0].started_at, leg.steps[0].recorded_at,
                 leg.steps[0].written_at, leg.steps[-1].written_at, leg.trained_at, leg.done_at]
        assert order == sorted(order) and None not in order
    timing = arm_timing(out, checkpoint_rule(arm.case.train.checkpoint_every))
    assert (timing.runs, timing.ranks, timing.steps, timing.device) == (2, 1, 4, "cpu")
    assert timing.phases.steps > 0 and timing.phases.checkpoint > 0


def test_a_rank_that_raises_still_writes_its_marks(write_case, tmp_path, monkeypatch):
    import harness.workload
    from harness.arms import plan_case
    from harness.launch.ranks import rank_main
    from harness.results.phases import read_phases
    from harness.spec.loader import load_cases
    from tests.launch.faults import Fault, with_fault

    plan = plan_case(load_cases([write_case("dies", train={"steps": 3})])[0])
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(harness.workload, "train_arm", with_fault(Fault("crash", 2)), raising=False)
    with pytest.raises(RuntimeError):
        rank_main.run_rank(plan.arm("eager"), tmp_path / "eager")
    (leg,) = read_phases(tmp_path / "eager", 0).legs
    assert [m.step for m in leg.steps] == [1] and leg.trained_at is None and leg.done_at is None


def test_the_rank_process_exits_with_its_output_flushed(write_case, tmp_path):
    """``python -m harness.launch.ranks.rank_main`` (no ``-u``, its stdout a pipe) ends without tearing
    the interpreter down: exit code 0, every line it printed delivered, its marks written."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from harness.arms import plan_case
    from harness.caseplan import write_plan
    from harness.results import read_steps
    from harness.results.phases import read_phases
    from harness.spec.loader import load_cases

    plan = plan_case(load_cases([write_case("bye", train={"steps": 2})])[0])
    case_dir = tmp_path / "bye"
    case_dir.mkdir()
    (case_dir / "case.json").write_text(json.dumps(plan.case.model_dump(mode="json")))
    write_plan(case_dir, plan)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "PYTHONUNBUFFERED")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    done = subprocess.run([sys.executable, "-m", "harness.launch.ranks.rank_main", "--case",
                           str(case_dir / "case.json"), "--arm", "eager", "--out",
                           str(case_dir / "eager")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "[eager r0] step 2/2" in done.stdout and "[eager r0] done: 2/2 steps" in done.stdout
    assert [r.step for r in read_steps(case_dir / "eager")[0]] == [1, 2]
    (leg,) = read_phases(case_dir / "eager", 0).legs
    assert leg.main_at is not None and leg.done_at is not None
    assert leg.spawned_at is not None and leg.spawned_at <= leg.main_at
