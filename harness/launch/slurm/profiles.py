"""Slurm cluster profiles: ``slurm/profiles/<name>.yaml`` -> a validated :class:`Profile`.

A profile holds what differs between clusters (partition, account, QoS, GPUs per node, CPUs and
memory per rank, time limits, setup lines such as module loads, a container, extra sbatch/srun
arguments, environment, NCCL and determinism settings). A case names its profile in
``resources.profile``; ``dcp-harness submit --profile P`` overrides it for every case. ``P`` is a
profile name (looked up in ``$DCP_HARNESS_PROFILES`` folders, then the repository's
``slurm/profiles``) or a path to a YAML file. Unknown keys are errors; every error names the file and
the field.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.errors import ConfigError

PROFILES_ENV = "DCP_HARNESS_PROFILES"
REPO_PROFILES = Path(__file__).resolve().parents[3] / "slurm" / "profiles"
_NAME = r"^[a-z0-9][a-z0-9._-]*$"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables that make cuBLAS and Transformer Engine choose reproducible algorithms.
DETERMINISM_ENV = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
}
# The launcher owns these; a profile setting them would break the rendezvous or device choice.
_RESERVED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "CUDA_VISIBLE_DEVICES")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Container(_Strict):
    """A container for the ranks, through the pyxis/enroot srun plugin (``--container-*``)."""

    image: str = Field(min_length=1)
    mounts: list[str] = []
    workdir: Optional[str] = None

    def srun_args(self) -> list[str]:
        args = [f"--container-image={self.image}"]
        if self.mounts:
            args.append(f"--container-mounts={','.join(self.mounts)}")
        if self.workdir:
            args.append(f"--container-workdir={self.workdir}")
        return args


class Profile(_Strict):
    """One cluster's settings (see the module docstring and ``slurm/profiles/*.yaml``)."""

    name: str = Field(pattern=_NAME)
    description: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    exclusive: bool = False
    # Request GPUs (--gpus-per-node). False for CPU-only clusters such as the dev cluster, where a
    # case's gpus_per_node is only its number of ranks per node.
    gpus: bool = True
    # GPUs one node has; a case asking for more ranks per node is refused before submission.
    gpus_per_node: int = Field(ge=1)
    max_nodes: Optional[int] = Field(default=None, ge=1)
    cpus_per_task: Optional[int] = Field(default=None, ge=1)
    mem_gb: Optional[float] = Field(default=None, gt=0)  # per node; None: the partition default
    # Memory of one GPU (GiB, as torch.cuda.get_device_properties reports it): submit refuses a
    # case whose predicted peak (harness.memplan) exceeds it. None: not checked.
    gpu_memory_gib: Optional[float] = Field(default=None, gt=0)
    # The torch of the compute nodes (e.g. "2.11"): which attention path the memory plan follows
    # (flash varlen takes fewer K/V heads from 2.12 on). None: the submitting machine's torch.
    torch_version: Optional[str] = Field(default=None, pattern=r"^\d+\.\d+")
    # Job time limit = arms x case time_min + time_margin_min, refused above max_time_min.
    time_margin_min: float = Field(default=10, ge=0)
    max_time_min: Optional[float] = Field(default=None, gt=0)
    # At most this many jobs of one array run at once (sbatch --array=...%N).
    array_parallelism: int = Field(default=16, ge=1)
    # Seconds before the time limit at which Slurm sends USR2 (submitit checkpoints and requeues).
    signal_delay_s: int = Field(default=120, ge=1)
    # How often a job may be requeued after a timeout (preemptions do not count).
    max_requeue: int = Field(default=3, ge=0)
    setup: list[str] = []
    container: Optional[Container] = None
    sbatch: dict[str, Any] = {}
    srun_args: list[str] = []
    env: dict[str, str] = {}
    nccl: dict[str, str] = {}
    determinism: bool = True
    # Interpreter on the compute nodes; None: the submitting interpreter (sys.executable).
    python: Optional[str] = None

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if key in _RESERVED_ENV:
                raise ValueError(f"{key} is set by the launcher from Slurm's variables; remove it")
        return v

    @field_validator("nccl")
    @classmethod
    def _nccl_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.match(r"^(TORCH_)?NCCL_[A-Z0-9_]+$", key):
                raise ValueError(f"{key!r} is not an NCCL variable (NCCL_* or TORCH_NCCL_*); "
                                 "put other variables under env")
        return v

    @field_validator("sbatch")
    @classmethod
    def _sbatch_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        owned = {"array", "output", "error", "nodes", "ntasks-per-node", "ntasks_per_node",
                 "gpus-per-node", "gpus_per_node", "time", "signal", "job-name", "job_name"}
        for key in v:
            if key.lstrip("-") in owned:
                raise ValueError(f"'{key}' is set by the harness from the case; remove it")
        return v

    @model_validator(mode="after")
    def _signal_fits(self) -> "Profile":
        if self.max_time_min is not None and self.signal_delay_s >= self.max_time_min * 60:
            raise ValueError(
                f"signal_delay_s ({self.signal_delay_s}) must be shorter than max_time_min "
                f"({self.max_time_min} min)")
        return self

    def environment(self) -> dict[str, str]:
        """Every variable the ranks get: determinism defaults < nccl < env."""
        out: dict[str, str] = dict(DETERMINISM_ENV) if self.determinism else {}
        out.update(self.nccl)
        out.update(self.env)
        return out

    def setup_lines(self) -> list[str]:
        """Shell lines of the sbatch script before srun: the profile's setup, then exports."""
        exports = [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.environment().items())]
        return list(self.setup) + exports

    def all_srun_args(self) -> list[str]:
        args = list(self.srun_args)
        if self.container is not None:
            args += self.container.srun_args()
        return args


# --------------------------------------------------------------------------- loading
def profile_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get(PROFILES_ENV, "").split(os.pathsep) if p]
    return extra + [REPO_PROFILES]


def find_profile(name_or_path: str, search: Optional[Sequence[Path]] = None) -> Path:
    """The YAML file of a profile name or path; ConfigError listing the known names if absent."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        if candidate.is_file():
            return candidate
        raise ConfigError(f"profile file {name_or_path} does not exist")
    dirs = list(search) if search is not None else profile_dirs()
    for d in dirs:
        for ext in (".yaml", ".yml"):
            path = d / f"{name_or_path}{ext}"
            if path.is_file():
                return path
    known = sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.y*ml")})
    raise ConfigError(
        f"no Slurm profile '{name_or_path}' in {', '.join(str(d) for d in dirs)}; "
        f"known profiles: {', '.join(known) or 'none'} (or pass a path to a profile YAML)")


def parse_profile(text: str, file: str) -> Profile:
    """Validate one profile document; errors read ``FILE: field 'a.b': message``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: a profile is one YAML mapping (name:, partition:, ...)")
    data.setdefault("name", Path(file).stem)
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
        msg = first["msg"]
        if first["type"] == "extra_forbidden":
            msg = f"unknown field; known fields: {', '.join(_known_fields(first['loc']))}"
        more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
        raise ConfigError(f"{file}: field '{loc}': {msg}{more}") from None


def _known_fields(loc: tuple) -> list[str]:
    model: type[BaseModel] = Container if loc and loc[0] == "container" else Profile
    return sorted(model.model_fields)


def load_profile(name_or_path: str, search: Optional[Sequence[Path]] = None) -> Profile:
    path = find_profile(name_or_path, search)
    return parse_profile(path.read_text(encoding="utf-8"), str(path))
