"""What a rank ran with: versions and the environment settings that change behaviour.

Step time, memory and even numerics move with the torch, CUDA and NCCL versions and with a few
environment variables (the caching allocator's configuration, NCCL's algorithms and buffer
registration, cuBLAS's workspace, TE's determinism switch). Every rank process records them once,
on its first step record (``harness.results.RunEnvironment``); golden files keep them, and a
golden key can include them (Megatron-LM keeps ``golden_values_{environment}_{platform}.json``:
``harness.golden.environment_key``). Importing this module does not import torch.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Mapping, Optional

from harness.kernels import probe as kernel_probe
from harness.results import RunEnvironment

# Variables recorded when set, because they change speed, memory or numerics.
SETTINGS = (
    "PYTORCH_CUDA_ALLOC_CONF",  # caching allocator: expandable segments, split sizes, GC
    "PYTORCH_ALLOC_CONF",  # its newer name (torch >= 2.9 reads both)
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "CUBLAS_WORKSPACE_CONFIG",  # deterministic cuBLAS workspaces
    "NCCL_GRAPH_REGISTER",  # NCCL buffer registration under CUDA graphs
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_NVLS_ENABLE",
    "NCCL_CUMEM_ENABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_BUFFSIZE",
    "TORCH_NCCL_AVOID_RECORD_STREAMS",
    "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUDA_LAUNCH_BLOCKING",
    "OMP_NUM_THREADS",  # CPU ranks: threads per process
    "MKL_CBWR",  # CPU ranks: MKL's code branch (the harness pins COMPATIBLE)
)


def settings_of(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The :data:`SETTINGS` that are set in ``environ``, as sorted (name, value) pairs."""
    return tuple(sorted((k, environ[k]) for k in SETTINGS if k in environ))


def current_environment(device: Any, environ: Optional[Mapping[str, str]] = None) -> RunEnvironment:
    """This process's environment on ``device`` (a torch device or its name)."""
    import torch

    dev = torch.device(device)
    nccl: Optional[str] = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in version) if isinstance(version, tuple) else str(version)
        except (RuntimeError, AttributeError):  # a build without NCCL
            nccl = None
    return RunEnvironment(
        torch=str(torch.__version__),
        cuda=torch.version.cuda,
        nccl=nccl,
        device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name(),
        settings=settings_of(os.environ if environ is None else environ),
        device_id=device_id(dev),
        kernels=kernel_probe(dev, environ),  # what decides the kernels (harness.kernels)
    )


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU as its kernels see it: its model, the instruction set torch's CPU kernels use
    and a digest of its feature flags (``Intel(R) Xeon(R) Processor, AVX512, flags 1a2b3c4d``):
    fp32 results of one deterministic run differ in their last bits between CPUs whose kernels
    take other paths, and repeat bitwise on one."""
    import hashlib
    import platform

    import torch

    model, flags = platform.processor() or "CPU", ""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            info = dict(line.split(":", 1) for line in f if ":" in line and line.strip())
        info = {k.strip(): v.strip() for k, v in info.items()}
        model, flags = info.get("model name", model), info.get("flags", "")
    except OSError:
        pass
    digest = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:8]
    return f"{model}, {torch.backends.cpu.get_cpu_capability()}, flags {digest}"


def device_id(device: Any) -> Optional[str]:
    """The physical device a rank runs on: ``GPU-<uuid>`` of a CUDA device (as ``nvidia-smi -L``
    prints it), the host's name for the CPU; None where torch cannot tell."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return socket.gethostname() or None
    uuid = getattr(torch.cuda.get_device_properties(dev), "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def describe(env: RunEnvironment) -> str:
    """One line: ``torch 2.11.0+cu130, CUDA 13.0, NCCL 2.27.3, NVIDIA H200; PYTORCH_CUDA_ALLOC_CONF=...``."""
    parts = [f"torch {env.torch}", f"CUDA {env.cuda}" if env.cuda else "no CUDA"]
    if env.nccl:
        parts.append(f"NCCL {env.nccl}")
    if env.device_name:
        parts.append(env.device_name)
    text = ", ".join(parts)
    if env.settings:
        text += "; " + " ".join(f"{k}={v}" for k, v in env.settings)
    return text


def differences(old: RunEnvironment, new: RunEnvironment) -> list[str]:
    """What changed between two environments, one phrase each (empty: the same). The physical
    device (``device_id``) is not a change of environment: another GPU of the same kind runs the
    same software; the golden step-time check reads it on its own."""
    out = []
    for name, a, b in (("torch", old.torch, new.torch), ("CUDA", old.cuda, new.cuda),
                       ("NCCL", old.nccl, new.nccl), ("device", old.device_name, new.device_name)):
        if a != b:
            out.append(f"{name} {a or '-'} -> {b or '-'}")
    was, now = dict(old.settings), dict(new.settings)
    for key in sorted(set(was) | set(now)):
        if was.get(key) != now.get(key):
            out.append(f"{key} {was.get(key, '(unset)')} -> {now.get(key, '(unset)')}")
    return out
