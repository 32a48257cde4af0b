"""The kernel identity a rank records (``harness.kernels``): what decides its kernels, read from
torch in this process and in one started with another ATen capability and thread count."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness import kernels
from harness.results import RunEnvironment, read_typed, record_json


def test_this_process_names_what_decides_its_cpu_kernels() -> None:
    torch = pytest.importorskip("torch")
    got = dict(kernels.probe("cpu", {}))
    assert got["torch"] == torch.__version__
    assert got["aten_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert got["intra_op_threads"] == str(torch.get_num_threads())
    assert got["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    if torch.backends.mkl.is_available():
        assert got["blas"].startswith("mkl ") and got["blas_isa"].isdigit()
    assert "onednn_max_isa" not in got
    assert dict(kernels.probe("cpu", {"ONEDNN_MAX_CPU_ISA": "AVX2"}))["onednn_max_isa"] == "AVX2"


def test_a_real_kernel_difference_shows_in_the_identity() -> None:
    pytest.importorskip("torch")
    code = "import json; from harness.kernels import probe; print(json.dumps(dict(probe('cpu'))))"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1",
           "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    other = json.loads(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                      capture_output=True, text=True).stdout)
    here = dict(kernels.probe("cpu"))
    assert other["aten_cpu_capability"] == "DEFAULT" and other["intra_op_threads"] == "1"
    if here["aten_cpu_capability"] != "DEFAULT":
        assert "ATen CPU capability" in " ".join(kernels.differences(here, other))
    if "blas_isa" in here and here["blas_isa"] not in ("0", "3"):  # an AVX2+ CPU: MKL drops down
        assert other["blas_isa"] != here["blas_isa"]


def test_an_environment_recorded_before_keeps_what_it_can_tell() -> None:
    assert kernels.legacy("2.13.0+cpu", "Intel(R) Xeon(R) Processor, AVX512, flags fc7df03f", None,
                          {"OMP_NUM_THREADS": "2"}) == (
        ("aten_cpu_capability", "AVX512"), ("intra_op_threads", "2"), ("torch", "2.13.0+cpu"))
    assert kernels.legacy("2.11.0+cu130", "NVIDIA H200", "13.0", {}) == (
        ("cuda", "13.0"), ("device", "NVIDIA H200"), ("torch", "2.11.0+cu130"))
    assert kernels.differences({"torch": "a", "blas_isa": "7"}, {"torch": "a"}) == [
        "BLAS ISA branch 7 -> (not recorded)"]
    assert kernels.unjudged({"torch": "a"}, {"torch": "a", "blas_isa": "7"}) == ["blas_isa"]


def test_the_identity_round_trips_through_a_record() -> None:
    env = RunEnvironment("2.13.0+cpu", kernels=(("aten_cpu_capability", "AVX2"), ("torch", "x")))
    assert record_json(env)["kernels"] == {"aten_cpu_capability": "AVX2", "torch": "x"}
    assert read_typed(RunEnvironment, record_json(env), "environment", nonfinite=False) == env
    assert "kernels" not in record_json(RunEnvironment("2.13.0+cpu"))  # older readers' layout
