"""Where a global rank sits in a case's layout, and how an emulated rank is named (pure).

An *emulated rank* (``emulate: {ranks: [...]}`` in a case, or ``--emulate-ranks``) runs alone on
one device as rank ``r`` of the case's ``N``-rank world, its communication stood in for by the
loopback layer (``harness/workload/loopback.py``). :meth:`RankPlace.label` is its one wording,
``emulated rank r of N (PP stage s of P, pool rank p)``: the plan, the launchers' logs and every
report line about such a rank use it, so nobody mistakes it for a real multi-GPU run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from harness.errors import ConfigError

if TYPE_CHECKING:
    from harness.spec.schema import Case


@dataclass(frozen=True)
class RankPlace:
    """Where global rank ``rank`` sits in its case's layout."""

    rank: int
    world: int
    pp: int
    pp_rank: int
    pool_rank: int
    ep_rank: int
    cp_blocks: tuple[tuple[int, tuple[int, ...]], ...]  # (CP size, global ranks of its block)

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    def label(self) -> str:
        """``emulated rank r of N (PP stage s of P, pool rank p)``: every line about it says so."""
        return (f"{short_label(self.rank, self.world)} (PP stage {self.pp_rank} of {self.pp}, "
                f"pool rank {self.pool_rank})")


def short_label(rank: int, world: int) -> str:
    """``emulated rank r of N``: the start of :meth:`RankPlace.label`, where a line has no room
    for the stage (a table cell, a check's detail)."""
    return f"emulated rank {rank} of {world}"


def emulated_note(ranks: Iterable[int], world: int) -> str:
    """``emulated rank 0 of 8, emulated rank 7 of 8``: the short labels of ``ranks``."""
    return ", ".join(short_label(r, world) for r in ranks)


def emulated_title(name: str, ranks: Iterable[int], world: int) -> str:
    """``NAME (emulated rank 0 of 8, emulated rank 7 of 8)``: how a line names a case, arm or
    entry of emulated ranks (``NAME`` alone without any)."""
    ranks = tuple(ranks)
    return f"{name} ({emulated_note(ranks, world)})" if ranks else name


def rank_place(case: "Case", rank: int) -> RankPlace:
    """The place of ``rank`` in ``case``'s layout; a ConfigError for a rank outside the world."""
    lay = case.layout
    world = lay.world
    if not 0 <= rank < world:
        raise ConfigError(f"case {case.id}: rank {rank} is not in its world of {world} ranks "
                          f"(0..{world - 1})")
    s = lay.pp_rank(rank)
    blocks = tuple((c, next(b for b in lay.cp_blocks(s, c) if rank in b)) for c in lay.cp_sizes)
    return RankPlace(rank, world, lay.pp, s, lay.pool_rank(rank), lay.ep_rank(rank), blocks)


def stage_ranks(case: "Case") -> tuple[int, int]:
    """The first rank of the first PP stage and the last rank of the last one."""
    return 0, case.layout.world - 1


def emulated_labels(case: "Case", ranks: Iterable[int]) -> tuple[str, ...]:
    """:meth:`RankPlace.label` of each of ``ranks``, in the order given."""
    return tuple(rank_place(case, r).label() for r in ranks)
