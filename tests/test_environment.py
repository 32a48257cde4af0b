"""The environment a rank ran with: versions and behaviour-changing settings, in the records (the
first one each process writes) and in golden files."""

from __future__ import annotations

import socket

import pytest

from harness.environment import (SETTINGS, cpu_name, current_environment, describe, differences,
                                 settings_of)
from harness.results import ResultsError, RunEnvironment, StepRecord, read_typed, record_json


def test_only_the_settings_that_change_behaviour_and_are_set() -> None:
    environ = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_GRAPH_REGISTER": "0",
               "HOME": "/root", "NCCL_ALGO": "Ring"}
    assert settings_of(environ) == (("NCCL_ALGO", "Ring"), ("NCCL_GRAPH_REGISTER", "0"),
                                    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"))
    assert {"PYTORCH_CUDA_ALLOC_CONF", "NCCL_GRAPH_REGISTER", "CUBLAS_WORKSPACE_CONFIG"} <= set(SETTINGS)


def test_this_process_on_cpu() -> None:
    torch = pytest.importorskip("torch")
    env = current_environment("cpu", {"OMP_NUM_THREADS": "1"})
    assert env.torch == torch.__version__ and env.cuda == torch.version.cuda
    assert env.device_name == cpu_name() and env.settings == (("OMP_NUM_THREADS", "1"),)
    assert describe(env).startswith(f"torch {torch.__version__}, ")
    assert env.device_id == socket.gethostname()  # a CPU rank's device is its host


def test_a_cpu_is_named_by_its_model_kernels_and_flags(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Xeon X\nflags\t\t: sse avx2 avx512f\n\n"
                    "processor\t: 1\nmodel name\t: Xeon X\nflags\t\t: avx2 sse avx512f\n")
    name = cpu_name(str(info))
    assert name.startswith(f"Xeon X, {torch.backends.cpu.get_cpu_capability()}, flags ")
    other = tmp_path / "other"
    other.write_text(info.read_text().replace(" avx512f", ""))
    assert cpu_name(str(other)) != name  # another feature set: another CPU for the kernels
    assert cpu_name(str(tmp_path / "none")).endswith(", flags e3b0c442")  # no /proc: no flags


def test_the_device_is_not_a_change_of_environment_and_round_trips() -> None:
    a = RunEnvironment("2.11.0", "13.0", "2.27.3", "NVIDIA H200", device_id="GPU-a")
    b = RunEnvironment("2.11.0", "13.0", "2.27.3", "NVIDIA H200", device_id="GPU-b")
    assert differences(a, b) == [] and "GPU-" not in describe(a)
    assert read_typed(RunEnvironment, record_json(a), "environment", nonfinite=False) == a and record_json(a)["device_id"] == "GPU-a"
    assert "device_id" not in record_json(RunEnvironment("2.13.0+cpu"))  # older readers' layout


def test_what_changed_between_two_environments() -> None:
    a = RunEnvironment("2.11.0", "13.0", "2.27.3", "NVIDIA H200", (("NCCL_ALGO", "Ring"),))
    b = RunEnvironment("2.11.0", "13.0", "2.28.1", "NVIDIA H200", (("NCCL_ALGO", "Tree"),
                                                                    ("NCCL_GRAPH_REGISTER", "1")))
    assert differences(a, a) == []
    assert differences(a, b) == ["NCCL 2.27.3 -> 2.28.1", "NCCL_ALGO Ring -> Tree",
                                 "NCCL_GRAPH_REGISTER (unset) -> 1"]
    assert describe(b) == ("torch 2.11.0, CUDA 13.0, NCCL 2.28.1, NVIDIA H200; NCCL_ALGO=Tree "
                           "NCCL_GRAPH_REGISTER=1")


def test_records_carry_it_and_reject_a_bad_one() -> None:
    env = RunEnvironment("2.13.0+cpu", settings=(("OMP_NUM_THREADS", "2"),))
    rec = StepRecord(step=1, loss=2.0, environment=env, resumed_from=4)
    data = record_json(rec)
    assert data["environment"]["settings"] == {"OMP_NUM_THREADS": "2"}
    assert StepRecord.from_dict(data) == rec
    with pytest.raises(ResultsError, match="field 'environment.settings.0'"):
        StepRecord.from_dict({**data, "environment": {"torch": "2", "settings": ["x"]}})
    with pytest.raises(ResultsError, match="field 'environment.rocm': unknown key 'rocm'"):
        StepRecord.from_dict({**data, "environment": {"torch": "2", "rocm": "6"}})
    with pytest.raises(ResultsError, match="bad environment: field 'torch'"):
        read_typed(RunEnvironment, {"torch": 2}, "environment", nonfinite=False)


def test_the_rank_writes_it_on_its_first_record_only(tmp_path) -> None:
    from harness.launch.ranks.rank_main import _step_callback
    from harness.results import StepWriter, read_steps

    env = RunEnvironment("2.13.0+cpu")
    writer = StepWriter(tmp_path, 0)
    writer.append(StepRecord(step=1, loss=2.0))  # recorded before a resume
    on_step = _step_callback(writer, 0, "eager", 3, platform="cpu", environment=env)
    on_step(StepRecord(step=1, loss=2.0))  # a step re-run after the resume: dropped
    on_step(StepRecord(step=2, loss=1.9))
    on_step(StepRecord(step=3, loss=1.8))
    recs = read_steps(tmp_path)[0]
    assert [r.environment for r in recs] == [None, env, None]


@pytest.mark.cuda
def test_a_cuda_rank_names_its_gpu_as_nvidia_smi_does() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import shutil
    import subprocess

    env = current_environment("cuda:0")
    assert env.device_id is not None and env.device_id.startswith("GPU-"), env.device_id
    if shutil.which("nvidia-smi") and "CUDA_VISIBLE_DEVICES" not in __import__("os").environ:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
        assert f"UUID: {env.device_id})" in listed, (env.device_id, listed)
