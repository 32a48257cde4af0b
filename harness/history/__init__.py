"""The history of sweeps: every sweep's figures in one database, trends and drift across sweeps,
and a dashboard page.

The sweep folder stays the source of truth; the history indexes it (``history rebuild``
re-imports folders). Modules, one job each:

* ``schema``: the tables (SQLAlchemy Core); ``migrations``: schema versions and the steps
  between them;
* ``db``: the URL (``--history``, ``$DCP_HARNESS_HISTORY``, ``results/history.sqlite``), opening
  SQLite or PostgreSQL, checks of what is there, serialized writes (``HistoryError``);
* ``extract``: a judged sweep as rows (pure); ``store``: ``record_sweep`` (idempotent) and
  ``rebuild``; ``labels``: which series a sweep belongs to (nightly, bisect, dirty, ...);
* ``query``: series of a figure over sweeps, the last sweeps; ``drift``: the drift rule (pure);
* ``plot``: ``history show``'s PNG; ``dashboard``: the self-contained HTML page.
"""

from __future__ import annotations

from .db import DEFAULT_PATH, ENV_VAR, History, HistoryError, history_url, open_history
from .drift import DEFAULT_WINDOW, DriftReport, check
from .query import Point, SeriesKey, last_sweeps, series
from .store import Recorded, rebuild, record_sweep

__all__ = ["DEFAULT_PATH", "DEFAULT_WINDOW", "DriftReport", "ENV_VAR",
           "History", "HistoryError", "Point", "Recorded", "SeriesKey", "check", "history_url",
           "last_sweeps", "open_history", "rebuild", "record_sweep", "series"]
