"""The names of golden files: the key (platform, or ``<environment>_<platform>``), the file of a
key (:func:`golden_file`), the side-by-side files of other kernel identities
(``golden_values_<key>.<variant>.json``: :func:`variant_name`, :func:`keys_of`), the platform of
a CUDA device name (:func:`platform_key`) and the environment part (:func:`environment_key`,
``auto``: :func:`resolve_environment`). Pure Python: no torch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Optional

from harness import kernels as kern
from harness.results import PathLike, RunEnvironment

from .metrics import Steps, environment_of


def golden_key(platform: str, environment: Optional[str] = None) -> str:
    """The key of a golden file: the platform, or ``<environment>_<platform>`` (Megatron's
    ``{environment}_{platform}``)."""
    return f"{environment}_{platform}" if environment else platform


def golden_file(golden_dir: PathLike, case_id: str, platform: str,
                environment: Optional[str] = None) -> Path:
    return Path(golden_dir) / case_id / f"golden_values_{golden_key(platform, environment)}.json"


# A golden file of another kernel identity beside the key's own: golden_values_<key>.<variant>.json
VARIANT_SEP = "."


def variant_name(env: Optional[RunEnvironment]) -> str:
    """The name a golden file of ``env``'s kernel identity takes beside the others of its key
    (``golden_values_cpu.avx2.json``): on CPU the ATen capability, with MKL's branch where it is
    not the harness's pinned one (``-mkl7``) and the intra-op threads where not 1 (``-t2``); on
    CUDA the compute capability and CUDA version (``sm_90-cu12.8``)."""
    kernels = kernels_of(env)[0] if env is not None else {}
    if "aten_cpu_capability" in kernels:
        name = kernels["aten_cpu_capability"].lower()
        if kernels.get("blas_isa") not in (None, "0"):
            name += f"-mkl{kernels['blas_isa']}"
        if kernels.get("intra_op_threads") not in (None, "1"):
            name += f"-t{kernels['intra_op_threads']}"
        return name
    if "capability" in kernels:
        return f"{kernels['capability']}-cu{kernels.get('cuda', 'x')}".lower()
    return "unknown"


def keys_of(files: Iterable[str], key: str) -> list[str]:
    """The keys among ``files`` that hold values of ``key``: ``key`` itself first, then its
    side-by-side files of other kernel identities (``<key>.<variant>``), sorted."""
    return sorted((k for k in files if k == key or k.startswith(key + VARIANT_SEP)),
                  key=lambda k: (k != key, k))


# A golden file's name; its group is the key (``golden_values_<key>.json``).
GOLDEN_NAME = re.compile(r"^golden_values_([a-z0-9][a-z0-9._-]*)\.json$")
# Words of a CUDA device name that say nothing about the chip ("NVIDIA GeForce RTX 4090").
_VENDOR_WORDS = ("nvidia", "geforce", "tesla", "quadro")
AUTO_ENVIRONMENT = "auto"


def platform_key(device_name: str) -> str:
    """The golden platform of a CUDA device name, as Megatron-LM keys its golden files by machine
    (``dgx_h100``, ``dgx_gb200``): ``NVIDIA H200`` -> ``h200``, ``NVIDIA GB200`` -> ``gb200``,
    ``NVIDIA H100 80GB HBM3`` -> ``h100``, ``NVIDIA A100-SXM4-80GB`` -> ``a100``, ``NVIDIA
    GeForce RTX 4090`` -> ``rtx4090``: the words up to and including the first one with a digit,
    vendor words dropped. bf16 and even fp32 numerics differ between GPU generations, so each has
    its own file."""
    words = [w for w in re.split(r"[^a-z0-9]+", device_name.lower()) if w]
    words = [w for w in words if w not in _VENDOR_WORDS]
    picked: list[str] = []
    for word in words:
        picked.append(word)
        if any(ch.isdigit() for ch in word):
            break
    key = "".join(picked) or "cuda"
    return key if key[0].isalnum() else "cuda"


def _major_minor(version: str) -> str:
    parts = re.findall(r"\d+", version)
    return ".".join(parts[:2]) if parts else "unknown"


def environment_key(env: RunEnvironment) -> str:
    """The environment part of a golden key (``compare.golden.environment: auto``): the torch and
    CUDA versions, major.minor: ``torch2.11-cu13.0``, ``torch2.13-cpu`` (a CPU build)."""
    cuda = f"cu{_major_minor(env.cuda)}" if env.cuda else "cpu"
    return f"torch{_major_minor(env.torch)}-{cuda}"


def kernels_of(env: RunEnvironment) -> tuple[dict[str, str], bool]:
    """The kernel identity an environment names (``harness.kernels``) and whether it is the whole
    one the rank probed (False: derived from an environment recorded before it was,
    :func:`harness.kernels.legacy`)."""
    if env.kernels:
        return dict(env.kernels), True
    return dict(kern.legacy(env.torch, env.device_name, env.cuda, dict(env.settings))), False


def resolve_environment(name: Optional[str], steps: Steps) -> Optional[str]:
    """The environment part of the golden key: ``name``, or for ``auto`` the records' own
    (:func:`environment_key`); ValueError when ``auto`` finds no recorded environment."""
    if name != AUTO_ENVIRONMENT:
        return name
    env = environment_of(steps)
    if env is None:
        raise ValueError("compare.golden.environment is auto but the arm's records name no "
                         "environment (written by an older dcp-harness); re-run the arm")
    return environment_key(env)
