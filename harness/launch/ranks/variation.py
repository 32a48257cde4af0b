"""How an arm's rank processes start, in everything its numbers must not depend on.

A repeat pair proves nothing about what both arms share, so the harness starts the arms whose
case says ``execution.vary_processes`` (the repeat arm of ``compare.repeat``, the one-rank
reference arm: ``harness.spec.derive``) otherwise than the others in all it controls:

* ``PYTHONHASHSEED``: ``0`` for every other arm, ``1`` here (the order of a ``set`` or of a
  ``dict`` built from one, of names or of strings, changes with it);
* the rank start order: the last rank first;
* the working folder and ``TMPDIR`` / ``TMP`` / ``TEMP``: folders of their own under the arm's
  folder (``proc/cwd``, ``proc/tmp``), where the others start in the launcher's working folder
  and the inherited temporary folder;
* the environment's order: reversed (``os.environ`` iterates in the order ``execve`` got it);
* a cold start: no warm fork server (a fresh interpreter importing everything itself).

A result that depends on any of them differs between the two arms of a repeat pair, and fails
it in one sweep instead of drifting between nights. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

HASH_SEED = "PYTHONHASHSEED"
TMP_VARS = ("TMPDIR", "TMP", "TEMP")
PROC_DIR = "proc"  # under the arm folder: the varied arm's working and temporary folders


@dataclass(frozen=True)
class Variation:
    """What a rank process's start varies (module doc); :data:`FIRST` and :data:`VARIED`."""

    hash_seed: str
    last_rank_first: bool
    own_folders: bool
    reversed_env: bool
    cold_start: bool

    def start_order(self, ranks: Sequence[int]) -> list[int]:
        return list(reversed(ranks)) if self.last_rank_first else list(ranks)

    def cwd(self, arm_dir: Path, given: Optional[Path]) -> Optional[Path]:
        """Where a rank starts: ``given`` (a command case's working folder) kept; else the
        varied arm's own folder (made now), else the launcher's (None)."""
        if given is not None or not self.own_folders:
            return given
        folder = Path(arm_dir).absolute() / PROC_DIR / "cwd"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def environment(self, env: Mapping[str, str], arm_dir: Path) -> dict[str, str]:
        """``env`` with the hash seed, the temporary folders and the order this start gives."""
        out = dict(env)
        out[HASH_SEED] = self.hash_seed
        if self.own_folders:
            tmp = Path(arm_dir).absolute() / PROC_DIR / "tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            out.update({name: str(tmp) for name in TMP_VARS})
        return dict(reversed(list(out.items()))) if self.reversed_env else out


FIRST = Variation(hash_seed="0", last_rank_first=False, own_folders=False, reversed_env=False,
                  cold_start=False)
VARIED = Variation(hash_seed="1", last_rank_first=True, own_folders=True, reversed_env=True,
                   cold_start=True)


def variation(vary_processes: bool) -> Variation:
    """The start of an arm whose case says ``execution.vary_processes``: :data:`VARIED`, else
    :data:`FIRST`."""
    return VARIED if vary_processes else FIRST


def describe(v: Variation) -> str:
    """One log line's worth: what this start varies."""
    if v == FIRST:
        return f"{HASH_SEED}={v.hash_seed}"
    parts = [f"{HASH_SEED}={v.hash_seed}"]
    parts += ["last rank first"] if v.last_rank_first else []
    parts += [f"own working and temporary folders ({PROC_DIR}/)"] if v.own_folders else []
    parts += ["environment reversed"] if v.reversed_env else []
    parts += ["cold start"] if v.cold_start else []
    return "varied start: " + ", ".join(parts)
