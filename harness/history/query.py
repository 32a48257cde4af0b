"""Reading the history: the series of a figure over sweeps, and the last sweeps.

A series is one figure of one case, subject (arm or pair), rank and platform over the sweeps that
hold it, oldest first; the last ``last`` points of each come by index (the ``series`` table, then
``figures`` by series and start), so the answer costs the points asked for, not the history's
size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sqlalchemy import Connection, func, select

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


def _matching(conn: Connection, case: Optional[str], metric: Optional[str],
              platform: Optional[str], kinds: tuple[str, ...], ranks: bool
              ) -> dict[int, SeriesKey]:
    t = schema.series
    where = [t.c.kind.in_(kinds)]
    if not ranks:
        where.append(t.c.rank == WHOLE)
    for column, value in ((t.c.case_id, case), (t.c.metric, metric), (t.c.platform, platform)):
        if value is not None:
            where.append(column.like(_like(value), escape="\\") if any(ch in value for ch in "*?")
                         else column == value)
    return {r.id: SeriesKey(r.case_id, r.kind, r.subject, r.rank, r.metric, r.platform)
            for r in conn.execute(select(t).where(*where))}


def _chunks(items: list, size: int = 500) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def series(conn: Connection, *, case: Optional[str] = None, metric: Optional[str] = None,
           platform: Optional[str] = None, last: int = 20, kinds: tuple[str, ...] = (ARM,),
           ranks: bool = False) -> dict[SeriesKey, list[Point]]:
    """Series -> its last ``last`` points, oldest first. ``case``, ``metric`` and ``platform``
    may hold ``*`` and ``?`` wildcards; ``kinds``: arm figures, pair check values or both;
    ``ranks``: each rank's too (else the arm as a whole).

    The points of the newest ``last`` sweeps come in one query (a nightly selection holds every
    series in each); a series with fewer there is read alone, newest first by its index."""
    keys = _matching(conn, case, metric, platform, kinds, ranks)
    if not keys:
        return {}
    f, s = schema.figures, schema.sweeps
    recent = [r.id for r in conn.execute(select(s.c.id).order_by(s.c.started.desc(),
                                                                  s.c.id.desc()).limit(last))]
    found: dict[int, list[tuple[str, int, float]]] = {k: [] for k in keys}
    ids = list(keys)
    for part in _chunks(ids):
        for r in conn.execute(select(f.c.series_id, f.c.started, f.c.sweep_id, f.c.value)
                              .where(f.c.sweep_id.in_(recent), f.c.series_id.in_(part))):
            found[r.series_id].append((r.started, r.sweep_id, r.value))
    for sid in ids:
        if len(found[sid]) < last:
            found[sid] = [(r.started, r.sweep_id, r.value) for r in conn.execute(
                select(f.c.started, f.c.sweep_id, f.c.value).where(f.c.series_id == sid)
                .order_by(f.c.started.desc(), f.c.sweep_id.desc()).limit(last))]
    return _points(conn, keys, found)


def _points(conn: Connection, keys: dict[int, SeriesKey],
            found: dict[int, list[tuple[str, int, float]]]) -> dict[SeriesKey, list[Point]]:
    """The points of each series, oldest first, with their sweep's and case's details."""
    s, c = schema.sweeps, schema.cases
    sweep_ids = sorted({sweep for pts in found.values() for _, sweep, _ in pts})
    sweeps, cases = {}, {}
    for part in _chunks(sweep_ids):
        sweeps.update({r.id: r for r in conn.execute(select(s.c.id, s.c.name, s.c.path)
                                                     .where(s.c.id.in_(part)))})
        cases.update({(r.sweep_id, r.case_id): r for r in conn.execute(
            select(c.c.sweep_id, c.c.case_id, c.c.commit, c.c.dirty, c.c.case_hash)
            .where(c.c.sweep_id.in_(part)))})
    out: dict[SeriesKey, list[Point]] = {}
    for sid, pts in found.items():
        key = keys[sid]
        rows = []
        for started, sweep_id, value in sorted(pts):
            sw, ca = sweeps[sweep_id], cases.get((sweep_id, key.case_id))
            rows.append(Point(sw.name, sw.path, started, ca.commit if ca else None,
                              ca.dirty if ca else None, ca.case_hash if ca else "", value))
        if rows:
            out[key] = rows
    return dict(sorted(out.items()))


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
