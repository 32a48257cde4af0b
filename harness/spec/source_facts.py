"""What each metrics source of a command case is (``command.metrics.source``), as data: the one
place that says which source writes what, so nothing else asks which source a case has.

:class:`SourceFacts` holds a source's static facts: its default path, whether one rank writes
the series for every rank (Megatron's last rank writes TensorBoard and prints the log lines) or
each rank its own file, whether a line's values average its first interval (Megatron's log
line of a run's second iteration), whether its records carry the checkpoint step a resumed
process loaded, whether it reports memory and the learning rate, and the optional package it
reads with. :func:`source_facts` gives a case's (a JSON-lines path without ``{rank}`` is one file
for every rank: one writer). The readers (``harness.metrics``) read by them; the judge, the
comparisons, ``validate`` and preflight ask them.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

from harness.spec.schema import MetricsSource, MetricsSpec

RANK_PLACEHOLDER = "{rank}"
LAST_RANK = "the last rank, which logs"


@dataclasses.dataclass(frozen=True)
class SourceFacts:
    """The static facts of one metrics source (module doc)."""

    default_path: str  # relative to the arm's folder, unless command.metrics.path says
    # One series for every rank, written by one rank (``writer``), not each rank's own values.
    one_writer: bool
    writer: str  # how the verdicts name the rank that writes it
    where: str  # where the series comes from, said in the completeness detail ({path} filled)
    averaged_first_interval: bool = False  # a run's second logged line averages its first two
    carries_checkpoint_step: bool = False  # records name the checkpoint a process loaded
    reports_memory: bool = True  # allocated / max allocated bytes per step (where written)
    reports_lr: bool = True  # the learning rate per step
    extra: Optional[str] = None  # the optional package the reader needs (pip extra), if any
    # What its memory needs to be a series (every step), for validate's line; None: nothing.
    memory_hint: Optional[str] = None

    def writer_rank(self, ranks: tuple[int, ...]) -> Optional[int]:
        """The rank whose records are the series (the last), or None where each rank writes
        its own."""
        return max(ranks) if self.one_writer and ranks else None


SOURCE_FACTS: Mapping[MetricsSource, SourceFacts] = {
    MetricsSource.TENSORBOARD: SourceFacts(
        default_path="tensorboard", one_writer=True, writer=LAST_RANK,
        where="the command's TensorBoard events ({path}), written by the one rank that logs "
              "(Megatron's last rank)",
        extra="tensorboard",
        memory_hint="memory only with --log-memory-to-tensorboard (mem-* scalars, the last "
                    "rank's own)"),
    MetricsSource.MEGATRON_LOG: SourceFacts(
        default_path="log.txt", one_writer=True, writer=LAST_RANK,
        where="the iteration lines the command printed, by the one rank that logs (Megatron's "
              "last rank)",
        averaged_first_interval=True,
        memory_hint="memory at the first two iterations unless --log-memory-interval N: a "
                    "growth needs a series"),
    MetricsSource.JSONL: SourceFacts(
        default_path="metrics/rank{rank}.jsonl", one_writer=False, writer="rank {rank}",
        where="the one JSON-lines file the command wrote ({path})",
        carries_checkpoint_step=True),
    MetricsSource.RECORD: SourceFacts(
        default_path="metrics/rank{rank}.jsonl", one_writer=False, writer="rank {rank}",
        where="the record API's files ({path})", carries_checkpoint_step=True),
}


def source_facts(spec: MetricsSpec) -> SourceFacts:
    """The facts of ``spec``'s source, its path as the case gives it (a per-rank source whose
    path has no ``{rank}`` is one file for every rank: one writer)."""
    facts = SOURCE_FACTS[spec.source]
    path = spec.path if spec.path is not None else facts.default_path
    if not facts.one_writer and RANK_PLACEHOLDER not in path:
        facts = dataclasses.replace(facts, one_writer=True, writer="the rank that writes it")
    return dataclasses.replace(facts, where=facts.where.replace("{path}", path))


def not_mapped(spec: MetricsSpec, field: str) -> str:
    """Why a check of ``field`` is not applicable: ``spec``'s source has no value of it."""
    return (f"the command's metrics (command.metrics.source {spec.source}) have no "
            f"{field.replace('_', ' ')}: map its tag or log key in command.metrics.tags to have "
            "it checked")
