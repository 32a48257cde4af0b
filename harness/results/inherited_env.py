"""The environment a command inherits from the invocation, recorded and replayed.

A command's processes get the environment ``dcp-harness`` runs in plus what the case and the
harness add (``command.env``, the rendezvous). A variable set in the shell (``NCCL_ALGO``, a
framework's flag, ``CUBLAS_WORKSPACE_CONFIG``) can change the training without being in the case,
so it is recorded where the run is:

* :func:`inherited`: the invoking environment less the shell session's own variables
  (:data:`SESSION_NAMES`, :data:`SESSION_PREFIXES`: the terminal, ssh, the prompt, Slurm's and the
  harness's per-job variables) with the value of every secret (the case's ``secret_env`` and any
  name with :data:`SECRET_WORDS` in it) replaced by :data:`REDACTED`;
* the manifest's ``SweepStart.environment`` (each invocation's) and each command arm's
  ``inherited_env.json`` (:func:`write_arm_env`: what its processes inherited, and what the case
  and harness set on top);
* the repro line (``launch.ranks.repro``) sets the recorded variables (secrets come from the caller's
  shell), so a run whose training an inherited variable changed reproduces from it;
* ``gate`` notes a pair whose two arms inherited different environments
  (:func:`differences`, ``harness.report.gate``).

Pure but for :func:`write_arm_env` / :func:`read_arm_env` (one JSON file each).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional

from pydantic import ConfigDict

from .files import ResultsError
from .records import Str
from .typed import read_json_record, write_json_record

ARM_ENV_FILE = "inherited_env.json"
REDACTED = "***"
# The shell session's and the job's own variables: not the run's configuration.
SESSION_NAMES = frozenset({
    "PWD", "OLDPWD", "SHLVL", "_", "TERM", "COLORTERM", "COLUMNS", "LINES", "PS1", "PS2", "PS3",
    "PS4", "PROMPT_COMMAND", "DISPLAY", "LS_COLORS", "LSCOLORS", "MAIL", "MAILPATH", "EDITOR",
    "VISUAL", "PAGER", "STY", "WINDOW", "HOSTNAME", "HOSTTYPE", "MACHTYPE", "OSTYPE", "SHELL",
    "SHLVL", "LOGNAME", "USER", "HOME", "MOTD_SHOWN", "JOB", "CUDA_VISIBLE_DEVICES",
    # the rendezvous the harness sets per arm
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "NNODES", "NODE_RANK", "NPROC_PER_NODE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE"})
SESSION_PREFIXES = ("SSH_", "XDG_", "DBUS_", "TMUX", "HIST", "LESS", "TERM_", "BASH_FUNC_",
                    "SLURM_", "SLURMD_", "SUBMITIT_", "PMI_", "PMIX_", "OMPI_", "PET_",
                    "TORCHELASTIC_", "DCP_HARNESS_", "PYTEST_", "COV_CORE_", "KITTY_", "VSCODE_",
                    "WT_", "ITERM_", "GNOME_", "DESKTOP_", "WAYLAND_", "SESSION_MANAGER")
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "APIKEY", "CREDENTIAL",
                "PRIVATE_KEY", "ACCESS_KEY")


def session_variable(name: str) -> bool:
    """Whether ``name`` is the session's or the job's own (never recorded or replayed)."""
    return name in SESSION_NAMES or name.startswith(SESSION_PREFIXES)


def secret(name: str, secret_names: Iterable[str] = ()) -> bool:
    """Whether the value of ``name`` is never written: a ``secret_env`` name, or one that says
    it is a secret (:data:`SECRET_WORDS`)."""
    upper = name.upper()
    return name in set(secret_names) or any(word in upper for word in SECRET_WORDS)


def inherited(environ: Mapping[str, str], secret_names: Iterable[str] = ()) -> dict[str, str]:
    """The variables of ``environ`` a command inherits that are the run's, sorted by name,
    secrets redacted (module doc)."""
    names = tuple(secret_names)
    return {k: (REDACTED if secret(k, names) else v) for k, v in sorted(environ.items())
            if not session_variable(k)}


def replayable(recorded: Mapping[str, str], set_by_case: Iterable[str] = ()) -> dict[str, str]:
    """What a repro line sets of ``recorded``: all but the redacted secrets (the caller's shell
    has them) and the variables the case or the harness sets anyway."""
    skip = set(set_by_case)
    return {k: v for k, v in recorded.items() if v != REDACTED and k not in skip}


def differences(a: Mapping[str, str], b: Mapping[str, str], labels: tuple[str, str]) -> list[str]:
    """``NAME=x (a) vs NAME=y (b)`` for each variable set differently (or in one only)."""
    out = []
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            show = lambda env, label: (f"{name}={env[name]} ({label})" if name in env
                                       else f"no {name} ({label})")
            out.append(f"{show(a, labels[0])} vs {show(b, labels[1])}")
    return out


@dataclass(frozen=True)
class ArmEnv:
    """``<arm>/inherited_env.json``, written and read through this type: what the arm's processes
    inherited (:func:`inherited`) and what the case and the harness set on top, by name."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    inherited: dict[Str, Str]
    set: dict[Str, Str]


def write_arm_env(arm_dir: Path, inherited_env: Mapping[str, str], set_env: Mapping[str, str]
                  ) -> None:
    """Record what an arm's processes inherit and what is set on top (no secret values:
    ``set_env`` holds none)."""
    write_json_record(Path(arm_dir) / ARM_ENV_FILE,
                      ArmEnv(dict(inherited_env), dict(sorted(set_env.items()))))


def _arm_env(arm_dir: Path) -> Optional[ArmEnv]:
    try:
        return read_json_record(Path(arm_dir) / ARM_ENV_FILE, ArmEnv, "inherited environment",
                                nonfinite=False)
    except ResultsError:
        return None


def read_arm_set_env(arm_dir: Path) -> Optional[dict[str, str]]:
    """What the case and the harness set on top for an arm (``ArmEnv.set``; None: it recorded
    none, or it is unreadable)."""
    env = _arm_env(arm_dir)
    return dict(env.set) if env is not None else None


def read_arm_env(arm_dir: Path) -> Optional[dict[str, str]]:
    """The inherited environment an arm recorded (None: it recorded none, or it is unreadable:
    the gate's hint about it is left out, nothing else depends on it)."""
    env = _arm_env(arm_dir)
    return dict(env.inherited) if env is not None else None
