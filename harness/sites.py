"""Allocation-site tables: where one rank's GPU memory was at the memory probe, by pool and site.

An emulated rank on CUDA (``harness.workload.emulate.emulate_rank(..., sites=True)``) records the
Python stack of every live allocation and, at ``train.memory_probe_step``, sums its allocator's
blocks into (pool, state, site) buckets (``harness.workload.allocsites.summarize_segments``). The
rank process keeps them as ``<arm>/sites.rank<r>.json`` (:func:`write_sites`, a :class:`SiteTable`);
the reports line two arms' tables up (:func:`diff_sites`, candidate minus reference): the
explanation of a reserved-bytes delta (TE #3353 left it "for follow-up profiling"). A table is
read through pydantic (:class:`SiteTable`): an unknown, mistyped or missing field is an error
naming it. A leaf: no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Iterable, Literal, Optional

from pydantic import ConfigDict, Field

from harness.results import PathLike, ResultsError, read_json_record, write_json_record
from harness.results.records import Int, Str
from harness.results.typed import keys_in_order

SITES_VERSION = 1
_SITES_FILE = re.compile(r"^sites\.rank(\d+)\.json$")
_FORBID = ConfigDict(extra="forbid")  # an unknown key is an error naming it
Count = Annotated[Int, Field(ge=0)]


@dataclass(frozen=True)
class SiteBytes:
    """Bytes of one (pool, state, site) bucket of one arm's allocator."""

    __pydantic_config__ = _FORBID

    pool: Str
    state: Str
    site: Str
    bytes: Count
    blocks: Count


@dataclass(frozen=True)
class SiteDelta:
    """One bucket in two arms: candidate and reference bytes (0 where absent)."""

    pool: str
    state: str
    site: str
    candidate: int
    reference: int

    @property
    def delta(self) -> int:
        return self.candidate - self.reference


@dataclass(frozen=True)
class SiteTable:
    """One rank's buckets at the memory probe after ``step`` (largest first): ``sites.rank<r>.json``,
    written and read through this type, its layout's ``version`` first."""

    __pydantic_config__ = _FORBID

    rank: Count
    step: Count
    sites: tuple[SiteBytes, ...]
    version: Literal[1] = SITES_VERSION

    _keys = keys_in_order("version", "rank", "step", "sites")


def sites_file(arm_dir: PathLike, rank: int) -> Path:
    return Path(arm_dir) / f"sites.rank{rank}.json"


def write_sites(arm_dir: PathLike, table: SiteTable) -> Path:
    return write_json_record(sites_file(arm_dir, table.rank), table)


def read_sites(arm_dir: PathLike) -> dict[int, SiteTable]:
    """Rank -> its table, for every ``sites.rank<r>.json`` in the arm folder (``{}`` without any);
    ResultsError naming the file for one that is unreadable or not its rank's."""
    folder = Path(arm_dir)
    out: dict[int, SiteTable] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.iterdir()):
        m = _SITES_FILE.match(path.name)
        if m is None:
            continue
        table = read_json_record(path, SiteTable, "allocation-site table", nonfinite=False)
        if table is None:  # not a file
            continue
        if table.rank != int(m.group(1)):
            raise ResultsError(f"{path}: holds the sites of rank {table.rank}")
        out[table.rank] = table
    return out


def pool_totals(sites: Iterable[SiteBytes]) -> dict[tuple[str, str], int]:
    """Bytes per (pool, state)."""
    out: dict[tuple[str, str], int] = {}
    for s in sites:
        out[(s.pool, s.state)] = out.get((s.pool, s.state), 0) + s.bytes
    return out


def diff_sites(candidate: Iterable[SiteBytes], reference: Iterable[SiteBytes],
               top: Optional[int] = None) -> tuple[SiteDelta, ...]:
    """Every bucket of either arm, candidate minus reference, largest absolute change first."""
    a = {(s.pool, s.state, s.site): s.bytes for s in candidate}
    b = {(s.pool, s.state, s.site): s.bytes for s in reference}
    rows = [SiteDelta(p, st, site, a.get((p, st, site), 0), b.get((p, st, site), 0))
            for (p, st, site) in sorted(set(a) | set(b))]
    rows = [r for r in rows if r.delta != 0]
    rows.sort(key=lambda r: (-abs(r.delta), r.pool, r.state, r.site))
    return tuple(rows if top is None else rows[:top])
