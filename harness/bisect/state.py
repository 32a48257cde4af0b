"""A bisect's state, ``<out>/bisect.json``: what is bisected (the key) and every step so far.

The file is rewritten atomically after every change (a step started, a step judged), so a bisect
stopped at any moment (Ctrl-C, SIGTERM, a lost login) resumes where it stopped when the same
command runs again: a judged step is not run again, a step that was started and not judged runs
again into its own sweep folder (a local ``run`` resumes its finished arms; a Slurm step whose jobs
were submitted is collected). Another command on the same folder is refused, naming what differs.
Read through pydantic with unknown keys forbidden: a damaged file is an error naming the field.
"""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.bisect.search import Verdict
from harness.errors import ConfigError
from harness.results.files import ResultsError, read_json, write_json_atomic
from harness.results.typed import problems_text

STATE_FILE = "bisect.json"
STATE_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Mode(str, Enum):
    BUILTIN = "builtin"  # the harness's own workload: each step runs that commit's harness
    COMMAND = "command"  # command cases: each step runs the command from that commit's checkout


class Role(str, Enum):
    GOOD_END = "good end"
    BAD_END = "bad end"
    SEARCH = "search"


class BisectKey(_Strict):
    """What a bisect is: a second command on the same folder must give the same key."""

    repo: str
    mode: Mode
    good: str
    bad: str
    paths: tuple[str, ...]
    k: Optional[str] = None
    profile: Optional[str] = None

    def differences(self, other: "BisectKey") -> list[str]:
        """``field: stored -> given`` for every field that differs."""
        mine, theirs = self.model_dump(mode="json"), other.model_dump(mode="json")
        return [f"{name}: {mine[name]!r} (this folder) vs {theirs[name]!r} (this command)"
                for name in mine if mine[name] != theirs[name]]


class Step(_Strict):
    n: int  # 1-based, in the order run
    sha: str
    subject: str
    role: Role
    sweep: str  # the step's sweep folder, relative to the bisect's folder
    started: str
    verdict: Optional[Verdict] = None  # None: started, not judged (interrupted)
    exit_code: Optional[int] = None
    ended: Optional[str] = None
    detail: str = ""  # why a step was skipped; the failing checks' summary of a bad one


class BisectState(_Strict):
    version: int = STATE_VERSION
    key: BisectKey
    commits: tuple[str, ...]  # the line searched, oldest first, the bad end last
    steps: tuple[Step, ...] = ()

    def judged(self) -> dict[str, Verdict]:
        """sha -> verdict of every judged step (the latest when a commit was run twice)."""
        return {s.sha: s.verdict for s in self.steps if s.verdict is not None}

    def step_of(self, sha: str) -> Optional[Step]:
        """The last step of ``sha`` (judged or not)."""
        return next((s for s in reversed(self.steps) if s.sha == sha), None)

    def with_step(self, step: Step) -> "BisectState":
        """This state with ``step`` added, or replacing the step of the same number."""
        kept = [s for s in self.steps if s.n != step.n]
        return self.model_copy(update={"steps": tuple(sorted([*kept, step], key=lambda s: s.n))})


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def state_path(out: Path) -> Path:
    return out / STATE_FILE


def write_state(out: Path, state: BisectState) -> None:
    write_json_atomic(state_path(out), state.model_dump(mode="json"))


def read_state(out: Path) -> Optional[BisectState]:
    """The state in ``out``, None when there is none yet; ConfigError when the file is damaged
    or foreign (it is left as it is)."""
    path = state_path(out)
    if not path.is_file():
        return None
    try:
        data = read_json(path)
        return BisectState.model_validate(data)
    except ResultsError as exc:
        raise ConfigError(f"{exc}; it is left as it is: pass a fresh --out") from None
    except ValidationError as exc:
        raise ConfigError(f"{path}: not a bisect state this version of dcp-harness wrote "
                          f"({problems_text(exc, BisectState)}); it is left as it is: pass a "
                          "fresh --out") from None


def check_folder(out: Path, key: BisectKey) -> Optional[BisectState]:
    """The state to resume in ``out`` (None: a new bisect). ConfigError when ``out`` is a file,
    a folder holding something else, or the folder of a different bisect."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a folder")
    state = read_state(out)
    if state is None:
        if out.is_dir() and any(out.iterdir()):
            raise ConfigError(f"--out {out} holds files but no {STATE_FILE}: it is not a bisect's "
                              "folder; pass a fresh --out (nothing in it was touched)")
        return None
    if state.key != key:
        differs = "; ".join(state.key.differences(key))
        raise ConfigError(f"--out {out} holds another bisect ({differs}); run that bisect's own "
                          "command to resume it, or pass a fresh --out")
    return state
