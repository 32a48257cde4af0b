"""How one arm's run ended (``<arm>/outcome.json``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, get_args

from pydantic import ConfigDict

from .files import PathLike
from .paths import OUTCOME_FILE
from .records import Float, Int, Str
from .typed import read_json_record, write_json_record

# How an arm's run ended (what each means: ArmOutcome); JSON spells it as is.
ArmStatus = Literal["ok", "failed", "timeout", "infra", "skipped"]
ARM_STATUSES: tuple[ArmStatus, ...] = get_args(ArmStatus)


@dataclass(frozen=True)
class ArmOutcome:
    """How one arm's run ended.

    status: ``ok`` (every rank exited 0), ``failed`` (a rank crashed), ``timeout`` (the arm ran
    past its limit), ``infra`` (the launcher/cluster failed: node lost, job never started),
    ``skipped`` (not run: this machine cannot run it, e.g. no CUDA; ``detail`` says why).
    ``repro`` is a one-line shell command that re-runs the arm; ``log_tail`` the last log lines
    (plus stacks of hung ranks); ``restarts`` how often it was requeued/resumed. ``cause``: what
    the failing rank's log says ended it (``ExcType: message``, from its last traceback;
    ``launch.ranks.failures.log_cause``), "" when it names none; an older ``outcome.json`` has none.
    """

    __pydantic_config__ = ConfigDict(extra="forbid")  # an unknown key is an error naming it

    status: ArmStatus
    returncode: Optional[Int] = None
    wall_s: Float = 0.0
    log_tail: Str = ""
    repro: Str = ""
    restarts: Int = 0
    detail: Str = ""
    cause: Str = ""

    def __post_init__(self) -> None:
        if self.status not in ARM_STATUSES:
            raise ValueError(f"ArmOutcome.status must be one of {ARM_STATUSES}, got {self.status!r}")
        if self.restarts < 0:
            raise ValueError(f"ArmOutcome.restarts must be >= 0, got {self.restarts}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        """One line, e.g. ``failed after 3.9 s (returncode 1): rank 0 exited with exit code 1;
        cause: ConfigError: step 1: ...`` (the cause last, where it is)."""
        if self.status == "skipped":
            return f"skipped: {self.detail}"
        what = {"ok": "ok", "failed": "failed", "timeout": "timeout", "infra": "infrastructure failure"}
        text = f"{what[self.status]} after {self.wall_s:.1f} s (returncode {self.returncode})"
        text = f"{text}: {self.detail}" if self.detail else text
        return f"{text}; cause: {self.cause}" if self.cause else text



def write_outcome(arm_dir_: PathLike, outcome: ArmOutcome) -> Path:
    return write_json_record(Path(arm_dir_) / OUTCOME_FILE, outcome)


def read_outcome(arm_dir_: PathLike) -> Optional[ArmOutcome]:
    """The arm's outcome, or None when it has none yet (never ran or never finished)."""
    return read_json_record(Path(arm_dir_) / OUTCOME_FILE, ArmOutcome, "outcome")
