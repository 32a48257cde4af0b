"""Reading the history: the series of a figure over sweeps, and the last sweeps.

A series is one figure of one case, subject (arm or pair), rank and platform over the sweeps that
hold it, oldest first; the last ``last`` points of each, chosen in the database (a window
function), so the answer costs the points asked for, not the history's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sqlalchemy import Connection, and_, func, select

from . import schema
from .schema import ARM, WHOLE


@dataclass(frozen=True, order=True)
class SeriesKey:
    case_id: str
    kind: str  # ARM or PAIR
    subject: str
    rank: int  # WHOLE: the arm or pair as a whole
    metric: str
    platform: str

    @property
    def label(self) -> str:
        rank = "" if self.rank == WHOLE else f" rank {self.rank}"
        where = f" [{self.platform}]" if self.platform else ""
        return f"{self.case_id} / {self.subject}{rank} {self.metric}{where}"


@dataclass(frozen=True)
class Point:
    sweep: str  # the folder's name
    path: str
    started: str
    commit: Optional[str]
    dirty: Optional[bool]
    case_hash: str
    value: float

    @property
    def commit_label(self) -> str:
        if self.commit is None:
            return "commit unknown"
        return self.commit[:12] + (" (local changes)" if self.dirty else "")


def _like(pattern: str) -> str:
    return pattern.replace("%", r"\%").replace("_", r"\_").replace("*", "%").replace("?", "_")


def series(conn: Connection, *, case: Optional[str] = None, metric: Optional[str] = None,
           platform: Optional[str] = None, last: int = 20, kinds: tuple[str, ...] = (ARM,),
           ranks: bool = False) -> dict[SeriesKey, list[Point]]:
    """Series -> its last ``last`` points, oldest first. ``case`` and ``metric`` may hold ``*``
    and ``?`` wildcards; ``kinds``: arm figures, pair check values or both; ``ranks``: each
    rank's too (else the arm as a whole)."""
    f, s, c = schema.figures, schema.sweeps, schema.cases
    part = (f.c.case_id, f.c.kind, f.c.subject, f.c.rank, f.c.metric, f.c.platform)
    rn = func.row_number().over(partition_by=part, order_by=(s.c.started.desc(), s.c.id.desc()))
    where = [f.c.kind.in_(kinds)]
    if not ranks:
        where.append(f.c.rank == WHOLE)
    for column, value in ((f.c.case_id, case), (f.c.metric, metric), (f.c.platform, platform)):
        if value is not None:
            where.append(column.like(_like(value), escape="\\") if any(ch in value for ch in "*?")
                         else column == value)
    inner = (select(*part, f.c.value, s.c.name, s.c.path, s.c.started, c.c.commit, c.c.dirty,
                    c.c.case_hash, rn.label("rn"))
             .select_from(f.join(s, s.c.id == f.c.sweep_id)
                          .join(c, and_(c.c.sweep_id == f.c.sweep_id, c.c.case_id == f.c.case_id)))
             .where(*where).subquery())
    rows = conn.execute(select(inner).where(inner.c.rn <= last)
                        .order_by(*(inner.c[col.name] for col in part), inner.c.rn.desc()))
    out: dict[SeriesKey, list[Point]] = {}
    for r in rows:
        key = SeriesKey(r.case_id, r.kind, r.subject, r.rank, r.metric, r.platform)
        out.setdefault(key, []).append(Point(r.name, r.path, r.started, r.commit, r.dirty,
                                             r.case_hash, r.value))
    return out


@dataclass(frozen=True)
class SweepRow:
    name: str
    path: str
    started: str
    host: str
    platform: str
    commit: Optional[str]
    dirty: Optional[bool]
    status: str
    exit_code: int
    cases: int


def last_sweeps(conn: Connection, last: int = 20) -> list[SweepRow]:
    """The newest ``last`` sweeps, newest first, with how many cases each holds."""
    s, c = schema.sweeps, schema.cases
    count = select(func.count()).where(c.c.sweep_id == s.c.id).scalar_subquery()
    rows = conn.execute(select(s.c.name, s.c.path, s.c.started, s.c.host, s.c.platform,
                               s.c.commit, s.c.dirty, s.c.status, s.c.exit_code,
                               count.label("cases"))
                        .order_by(s.c.started.desc(), s.c.id.desc()).limit(last))
    return [SweepRow(*r) for r in rows]


def sweep_count(conn: Connection) -> int:
    return conn.execute(select(func.count()).select_from(schema.sweeps)).scalar_one()
