import pytest

from harness.launch.rank_main import first_slurm_host, resolve_rank_env, step_line
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
    from harness.launch.rank_main import _step_callback, device_platform
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
    from harness.launch.rank_main import device_platform

    name = torch.cuda.get_device_name(0)
    key = device_platform("cuda:0")
    assert key == platform_key(name) and key.isalnum(), (name, key)
    if "H200" in name:
        assert key == "h200"
