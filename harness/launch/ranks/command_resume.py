"""The ``-resumed`` arm of a command case (``compare.resume`` with ``command.resume``): the
command run twice, as Megatron-LM's ``ckpt-resume`` functional tests run it.

1. the first run gets ``command.resume.save`` (it must save after step ``{stop}`` =
   ``compare.resume.at_step`` and exit);
2. between the runs the harness reads ``command.resume.iteration_file`` if the case names one
   (Megatron's ``latest_checkpointed_iteration.txt``: the iteration the checkpoint holds by the
   command's own metadata);
3. the second run gets ``command.resume.load`` (it must load that checkpoint and go on to
   ``train.steps``).

Each run's metrics are read apart (``harness.metrics.source_mark``: the log's lines, event files
or JSON lines each run added), then joined into the arm's records: the first run's steps up to
the stop, the second run's after it. Every record of the second run says what the harness saw
(``StepRecord.resumed_from``: the step before the second run's first logged iteration, None when
it logged step 1 again; ``checkpoint_step``: the iteration file's number), unless the command
wrote them itself (the record API): the resume pair's ``resumed_after`` and
``loaded_checkpoint`` checks judge them (``harness.compare.contracts.resume``), so a second run
that starts from step 1 again, or from another checkpoint, fails the pair naming it even where
its losses match.

A first run that does not stop after ``{stop}`` (it logged beyond it, or ended before it) or a
run that writes no metrics fails the arm with the reason: the case's ``save`` arguments do not
do what the resume needs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from harness.caseplan import CasePlan, PlannedArm
from harness.metrics import MetricsError, SourceMark, read_between, source_mark
from harness.results import ArmOutcome, StepRecord, StepWriter
from harness.spec.command import RESUME_LEGS, fill

Records = dict[int, list[StepRecord]]


def resume_legs(arm: PlannedArm) -> tuple[Optional[str], ...]:
    """The runs of ``arm``: ``("save", "load")`` for a ``-resumed`` arm, else one plain run."""
    return RESUME_LEGS if arm.case.execution.interrupt_after is not None else (None,)


def stop_step(arm: PlannedArm) -> int:
    """The step the first run of a ``-resumed`` arm stops after."""
    stop = arm.case.execution.interrupt_after
    assert stop is not None
    return stop


@dataclass(frozen=True)
class Checkpointed:
    """What ``command.resume.iteration_file`` said between the runs: ``step`` (None when the case
    names no file, or it cannot be read: ``problem`` says why)."""

    step: Optional[int] = None
    problem: Optional[str] = None


def read_iteration_file(plan: CasePlan, values: dict[str, object]) -> Checkpointed:
    """The iteration ``command.resume.iteration_file`` (placeholders filled with ``values``)
    names: its first word, a whole number (Megatron writes the number, or ``release``)."""
    resume = plan.case.command.resume  # type: ignore[union-attr]
    if resume is None or resume.iteration_file is None:
        return Checkpointed()
    path = Path(fill(resume.iteration_file, values))
    try:
        words = path.read_text(encoding="utf-8", errors="replace").split()
    except OSError as exc:
        return Checkpointed(problem=f"command.resume.iteration_file {path}: cannot be read after "
                                    f"the first run ({exc.strerror or exc})")
    if not words or not words[0].isdigit():
        return Checkpointed(problem=f"command.resume.iteration_file {path}: "
                                    f"{(words or ['nothing'])[0]!r} is not an iteration number")
    return Checkpointed(step=int(words[0]))


def _last(records: Records) -> int:
    return max((r.step for recs in records.values() for r in recs), default=0)


def _first(records: Records) -> int:
    return min((r.step for recs in records.values() for r in recs), default=0)


def first_run_problem(records: Records, stop: int) -> Optional[str]:
    """Why the first run's records do not end at the stop (None when they do)."""
    last = _last(records)
    if last == stop:
        return None
    if last == 0:
        return "its first run (command.resume.save) wrote no step to its metrics"
    if last > stop:
        return (f"its first run (command.resume.save) did not stop after step {stop}: it logged "
                f"up to step {last} (the save arguments must make the command save and exit "
                "after {stop})")
    return (f"its first run (command.resume.save) ended after step {last}, before the stop "
            f"after step {stop}")


def joined(first: Records, second: Records, stop: int, loaded: Checkpointed) -> Records:
    """The arm's records: the first run's up to ``stop``, the second run's after it, each of
    those saying where its process started (module doc)."""
    start = _first(second)
    resumed_from = start - 1 if start > 1 else None
    out: Records = {}
    for rank in sorted(set(first) | set(second)):
        later = [dataclasses.replace(
            r, resumed_from=r.resumed_from if r.resumed_from is not None else resumed_from,
            checkpoint_step=r.checkpoint_step if r.checkpoint_step is not None else loaded.step)
            for r in second.get(rank, []) if r.step > stop]
        out[rank] = [r for r in first.get(rank, []) if r.step <= stop] + later
    return out


@dataclass(frozen=True)
class Leg:
    """One run of a ``-resumed`` arm as it went: its outcome and where its metrics begin and
    end in the source."""

    outcome: ArmOutcome
    since: SourceMark
    until: SourceMark


def run_resumed(plan: CasePlan, arm: PlannedArm, arm_dir: Path, path: str,
                start: SourceMark, run: Callable[[str], ArmOutcome],
                values: dict[str, object], log: Callable[[str], None]) -> tuple[list[Leg],
                                                                               Checkpointed]:
    """Run both runs (``run(leg)`` starts every process of one and waits for them), marking the
    source between them and reading the iteration file after the first; stops after a run
    that failed. The runs as they went, and what the iteration file said."""
    spec = plan.case.command.metrics  # type: ignore[union-attr]
    legs: list[Leg] = []
    loaded = Checkpointed()
    since = start
    for leg in RESUME_LEGS:
        if leg == "load":
            loaded = read_iteration_file(plan, values)
            said = (f"the iteration file names step {loaded.step}" if loaded.step is not None
                    else loaded.problem or "the case names no iteration file")
            log(f"second run (command.resume.load): loading the checkpoint; {said}")
        else:
            log(f"first run (command.resume.save): saving after step {stop_step(arm)}, then exit")
        outcome = run(leg)
        until = source_mark(spec, arm_dir, path, arm.ranks)
        legs.append(Leg(outcome, since, until))
        if not outcome.ok:
            break
        since = until
    return legs, loaded


def resumed_records(plan: CasePlan, arm: PlannedArm, arm_dir: Path, path: str,
                    legs: Sequence[Leg], loaded: Checkpointed, platform: Optional[str]
                    ) -> tuple[Optional[Records], str]:
    """The arm's joined records and what the runs did (a line for its outcome), or None and
    why the arm fails."""
    spec = plan.case.command.metrics  # type: ignore[union-attr]
    stop = stop_step(arm)
    read: list[Records] = []
    for which, leg in zip(("first", "second"), legs):
        try:
            read.append(read_between(spec, arm_dir, arm.ranks, platform, path, leg.since,
                                     leg.until))
        except MetricsError as exc:
            return None, f"its {which} run's metrics ({spec.source}) cannot be read: {exc}"
    problem = first_run_problem(read[0], stop)
    if problem is not None:
        return None, problem
    if _last(read[1]) == 0:
        return None, "its second run (command.resume.load) wrote no step to its metrics"
    said = (f"a checkpoint of step {loaded.step}" if loaded.step is not None
            else loaded.problem or "no iteration file named")
    note = (f"first run: steps {_first(read[0])}-{stop} (then saved and exited; {said}); second "
            f"run: steps {_first(read[1])}-{_last(read[1])}")
    return joined(read[0], read[1], stop, loaded), note


def write_records(arm_dir: Path, records: Records) -> None:
    """Each rank's records into ``rank<k>.jsonl`` (afresh)."""
    for rank, recs in records.items():
        writer = StepWriter(arm_dir, rank, resume=False)
        for rec in recs:
            writer.append(rec)
