"""What decides the kernels a rank's arithmetic runs: the part of its environment under which a
deterministic run repeats its numbers bit for bit on another machine.

A golden value is bitwise only where the run takes the same kernels as the recording. The CPU's
whole feature-flag list names a machine, not its kernels: two hosts with other flag lists (a
microcode or hypervisor difference) run the same ATen and MKL code paths and give the same bits,
while one host with ``ATEN_CPU_CAPABILITY=default`` or another thread count does not. So the
identity is what picks the code (:func:`probe`):

* ``torch`` (version and build) and ``torch_git`` (its commit): every kernel;
* CPU: ``aten_cpu_capability`` (``torch.backends.cpu.get_cpu_capability()``: the vectorised ATen
  kernels, ``AVX512`` / ``AVX2`` / ``DEFAULT``), ``blas`` (the BLAS torch was built with and its
  version), ``blas_isa`` (MKL's dispatch branch, ``mkl_serv_cpu_detect``, which follows the CPU,
  ``MKL_ENABLE_INSTRUCTIONS`` and ``MKL_CBWR``; absent where the build does not export it),
  ``onednn`` (its version) and ``onednn_max_isa`` (``ONEDNN_MAX_CPU_ISA`` / ``DNNL_MAX_CPU_ISA``
  where set), ``intra_op_threads`` (``torch.get_num_threads()``: how reductions and GEMMs split);
* CUDA: ``device`` (its name), ``capability`` (``sm_90``), ``cuda`` (the runtime torch was built
  with), ``cudnn``, ``cublas`` (the cuBLAS wheel's version where one is installed), and the TF32
  switches (``allow_tf32``, ``cudnn_allow_tf32``);
* both: ``float32_matmul_precision`` (fp32 GEMMs may run in TF32 / bf16 otherwise).

The dtype is the case's (the golden check is bitwise only for a deterministic fp32 arm), and
the settings of ``harness.environment.SETTINGS`` are recorded beside this identity. Golden files
written before the identity was recorded are read with one derived from what they kept
(:func:`legacy`): the torch version, the ATen capability that the CPU's name carried, and
``OMP_NUM_THREADS`` where it was set. Pure Python apart from :func:`probe`, which imports torch.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional

Kernels = tuple[tuple[str, str], ...]  # (key, value), sorted by key

# One phrase per key, for the check's detail.
WHAT: Mapping[str, str] = {
    "torch": "torch version", "torch_git": "torch build", "aten_cpu_capability": "ATen CPU capability",
    "blas": "BLAS", "blas_isa": "BLAS ISA branch", "onednn": "oneDNN",
    "onednn_max_isa": "oneDNN max ISA", "intra_op_threads": "intra-op threads",
    "device": "device", "capability": "compute capability", "cuda": "CUDA", "cudnn": "cuDNN",
    "cublas": "cuBLAS", "allow_tf32": "TF32 matmul", "cudnn_allow_tf32": "cuDNN TF32",
    "float32_matmul_precision": "float32 matmul precision",
}
_ONEDNN_ISA_VARS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def _mkl_branch(torch: Any) -> Optional[str]:
    """MKL's CPU dispatch branch (an integer code; 7 on AVX-512 Xeons, lower with
    ``MKL_ENABLE_INSTRUCTIONS=AVX2``, 0 with ``MKL_CBWR=COMPATIBLE``), or None where torch's
    library exports no MKL service symbol (a build without MKL)."""
    import ctypes

    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        detect = getattr(ctypes.CDLL(lib), "mkl_serv_cpu_detect")
    except (OSError, AttributeError):
        return None
    detect.restype = ctypes.c_int
    return str(detect())


def _config_version(torch: Any, pattern: str) -> Optional[str]:
    """A version from ``torch.__config__.show()`` (the build's own list), or None."""
    try:
        text = torch.__config__.show()
    except (AttributeError, RuntimeError):
        return None
    match = re.search(pattern, text)
    return match.group(1) if match else None


def _package_version(*names: str) -> Optional[str]:
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def probe(device: Any, environ: Optional[Mapping[str, str]] = None) -> Kernels:
    """This process's kernel identity on ``device`` (a torch device or its name)."""
    import torch

    env = os.environ if environ is None else environ
    dev = torch.device(device)
    out: dict[str, Optional[str]] = {
        "torch": str(torch.__version__),
        "torch_git": (getattr(torch.version, "git_version", None) or "")[:12] or None,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        out.update(device=torch.cuda.get_device_name(dev), capability=f"sm_{major}{minor}",
                   cuda=torch.version.cuda, cudnn=None if cudnn is None else str(cudnn),
                   cublas=_package_version("nvidia-cublas-cu13", "nvidia-cublas-cu12",
                                           "nvidia-cublas"),
                   allow_tf32=str(torch.backends.cuda.matmul.allow_tf32),
                   cudnn_allow_tf32=str(torch.backends.cudnn.allow_tf32))
    else:
        mkl = torch.backends.mkl.is_available()
        blas_version = _config_version(torch, r"Math Kernel Library Version ([0-9.]+)") if mkl else None
        out.update(aten_cpu_capability=str(torch.backends.cpu.get_cpu_capability()),
                   blas=f"mkl {blas_version or '?'}" if mkl else _config_version(
                       torch, r"BLAS_INFO=([A-Za-z0-9_]+)"),
                   blas_isa=_mkl_branch(torch) if mkl else None,
                   onednn=_config_version(torch, r"MKL-DNN v([0-9.]+)")
                   if torch.backends.mkldnn.is_available() else None,
                   onednn_max_isa=next((env[v] for v in _ONEDNN_ISA_VARS if env.get(v)), None),
                   intra_op_threads=str(torch.get_num_threads()))
    return tuple(sorted((k, v) for k, v in out.items() if v is not None))


_CAPABILITY_IN_NAME = re.compile(r", (AVX512|AVX2|DEFAULT|ZVECTOR|VSX|SVE\d*|[A-Z0-9_]+), flags [0-9a-f]+$")


def legacy(torch_version: str, device_name: Optional[str], cuda: Optional[str],
           settings: Mapping[str, str]) -> Kernels:
    """The identity an environment recorded before :func:`probe` existed still tells: the torch
    version; on CPU the ATen capability its CPU name carried (``..., AVX512, flags 1a2b3c4d``:
    ``harness.environment.cpu_name``) and the intra-op threads ``OMP_NUM_THREADS`` set; on CUDA
    the device and the CUDA version."""
    out = {"torch": torch_version}
    match = _CAPABILITY_IN_NAME.search(device_name or "")
    if match:
        out["aten_cpu_capability"] = match.group(1)
        if settings.get("OMP_NUM_THREADS"):
            out["intra_op_threads"] = settings["OMP_NUM_THREADS"]
    elif cuda:
        out.update(cuda=cuda, **({"device": device_name} if device_name else {}))
    return tuple(sorted(out.items()))


def differences(recorded: Mapping[str, str], run: Mapping[str, str]) -> list[str]:
    """What differs between the kernel identity a golden file was recorded with and the run's,
    one phrase per key (``intra-op threads 2 -> 1``); empty: the same kernels. A key the recording
    names and the run does not is a difference; a key only the run names (a file recorded before
    it was) is not judged (:func:`unjudged`)."""
    out = []
    for key in sorted(recorded):
        if recorded[key] != run.get(key):
            out.append(f"{WHAT.get(key, key)} {recorded[key]} -> {run.get(key, '(not recorded)')}")
    return out


def unjudged(recorded: Mapping[str, str], run: Mapping[str, str]) -> list[str]:
    """Keys of the run's identity the recording does not name (an older golden file)."""
    return sorted(k for k in run if k not in recorded)
