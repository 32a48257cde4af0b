"""The Slurm job's events, ``<case>/slurm_events.jsonl``: one typed record per line, written by the
job's tasks (``slurm.job``) and read by the job itself (a command arm's tasks wait on each other's
events) and by ``collect`` (an ended arm's wall time, whether it started).

* :class:`ArmStart`: task 0 starts an arm (a built-in arm: ``resumed_after_step``, the steps rank
  0 held; a command arm: ``processes``; an emulated arm: ``emulated``, its ranks, and
  ``recorded_steps``, the steps each held).
* :class:`TaskStart`: a task of the job starts its share of an arm, or sits it out (``task``, its
  rank in the job; ``node``, its node's index in the allocation; ``host``, the host name it runs
  on): where each rank of a job of several nodes ran.
* :class:`ProcessEnd`: one process of a command arm ended (``process``, its ``status``).
* A ``-resumed`` command arm runs twice: the ``arm_start`` and ``process_end`` events of its
  second run say ``leg: 1`` (its first run's name none).
* :class:`ArmEnd`: task 0 ended an arm (``wall_s``; ``status`` for a command or emulated arm).

Every event names its ``arm``, the ``job_id``, the job's ``restarts`` and the ``time`` (seconds
since the epoch). A line is a JSON object of those keys (sorted; keys a kind of arm does not set
are left out), appended in one ``write`` with ``O_APPEND`` so the tasks of a job can share the
file. Each event is validated when it is made and when it is read: a JSON object with an unknown
key, without one it needs or with a value of the wrong type is a ``ResultsError`` naming the file
and line. A line that is not JSON at all is left out, as it always was: a task killed mid-write, or
two nodes appending at once on a shared filesystem without atomic appends, tears a line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from harness.results import ArmStatus, ResultsError

EVENTS_FILE = "slurm_events.jsonl"


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    arm: str
    job_id: str
    restarts: int = Field(ge=0)
    time: float


class ArmStart(_Event):
    """Task 0 starts an arm (module doc)."""

    event: Literal["arm_start"] = "arm_start"
    resumed_after_step: Optional[int] = None
    processes: Optional[int] = None
    leg: Optional[int] = Field(default=None, ge=1)  # the second run of a resumed command arm
    emulated: Optional[tuple[int, ...]] = None
    recorded_steps: Optional[dict[str, int]] = None


class TaskStart(_Event):
    """A task of the job starts (its share of) an arm: where it runs."""

    event: Literal["task_start"] = "task_start"
    task: int = Field(ge=0)
    node: int = Field(ge=0)
    host: str


class ProcessEnd(_Event):
    """One process of a command arm ended."""

    event: Literal["process_end"] = "process_end"
    process: int
    status: ArmStatus
    leg: Optional[int] = Field(default=None, ge=1)  # the second run of a resumed command arm


class ArmEnd(_Event):
    """Task 0 ended an arm."""

    event: Literal["arm_end"] = "arm_end"
    wall_s: float
    status: Optional[ArmStatus] = None


SlurmEvent = Union[ArmStart, TaskStart, ProcessEnd, ArmEnd]
_LINE: TypeAdapter[SlurmEvent] = TypeAdapter(
    Annotated[SlurmEvent, Field(discriminator="event")])


def append_event(case_dir: Path, event: SlurmEvent) -> None:
    """Append ``event`` to the case's events file, in one write (module doc)."""
    line = (json.dumps(event.model_dump(mode="json", exclude_none=True), sort_keys=True) + "\n")
    fd = os.open(Path(case_dir) / EVENTS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _problems(exc: ValidationError) -> str:
    said = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"][1:]] or [str(p) for p in err["loc"]]  # less the kind
        said.append(f"{'.'.join(loc) or 'event'}: {err['msg']}")
    return "; ".join(said)


def read_events(case_dir: Path) -> list[SlurmEvent]:
    """The case's events in the order they were written ([] without a file; torn lines left
    out); a ResultsError naming file:line for a JSON line that is not an event."""
    path = Path(case_dir) / EVENTS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out: list[SlurmEvent] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(_LINE.validate_json(line))
        except ValidationError as exc:
            if any(err["type"] == "json_invalid" for err in exc.errors()):
                continue  # a torn line (module doc)
            raise ResultsError(f"{path}:{number}: not a Slurm job event ({_problems(exc)}); the "
                               "file was edited or written by another harness version") from None
    return out
