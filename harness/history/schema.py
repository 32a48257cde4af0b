"""The history database's tables (SQLAlchemy Core), the schema of version :data:`SCHEMA_VERSION`.

Every sweep table carries ``sweep_id`` (``sweeps.id``), so a sweep is replaced or removed by its
id alone. A ``series`` is one figure followed over sweeps: (case, kind, subject, rank, metric,
platform), ``subject`` an arm (its own figures) or a pair (the values of its checks), ``rank`` -1
for the arm or pair as a whole; ``figures`` holds one value per sweep and series, with the sweep's
start, so the last N points of a series are an index range.
``migrations`` builds these tables step by step; a test checks that the steps end at exactly this.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

SCHEMA_VERSION = 3
APPLICATION = "dcp-harness history"  # meta.application: what tells our database from a foreign one
ARM, PAIR = "arm", "pair"  # figures.kind: an arm's own figure, or a pair's check value
WHOLE = -1  # figures.rank of an arm's (or a pair's) figure, not one rank's
DEFAULT_LABEL = "adhoc"  # sweeps.label of a sweep run without --label (``labels``)

metadata = MetaData()

meta = Table(
    "meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

sweeps = Table(
    "sweeps", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", String(64), nullable=False, unique=True),  # identity: first start + folder name
    Column("fingerprint", String(64), nullable=False),  # what was recorded: re-adding is a no-op
    Column("name", Text, nullable=False),
    Column("path", Text, nullable=False),
    Column("started", String(32), nullable=False),  # UTC, ISO 8601 (sorts as text)
    Column("recorded", String(32), nullable=False),
    Column("host", Text, nullable=False),
    Column("command", String(16), nullable=False),
    Column("selection", Text, nullable=False),  # JSON: paths, -k, tags, emulated ranks
    Column("platform", Text, nullable=False),  # the arms' platforms, comma-joined
    Column("commit", String(64)),  # this repository's (built-in cases), None: unknown
    Column("dirty", Boolean),
    Column("repo", Text),
    Column("status", String(16), nullable=False),
    Column("exit_code", Integer, nullable=False),
    Column("code", Text, nullable=False, server_default="[]"),  # v2: every repository, JSON
    # v3: the series the sweep belongs to (``labels``: nightly, bisect, dirty, ...), and its
    # commit's place in the first-parent history (None: unknown): what orders a series.
    Column("label", String(64), nullable=False, server_default=DEFAULT_LABEL),
    Column("position", Integer),
)
Index("ix_sweeps_started", sweeps.c.started)

cases = Table(
    "cases", metadata,
    Column("sweep_id", Integer, nullable=False),
    Column("case_id", Text, nullable=False),
    Column("case_hash", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("commit", String(64)),
    Column("dirty", Boolean),
    Column("platform", Text, nullable=False),
    Column("emulated", Boolean, nullable=False),
    Column("parked", String(16)),
    Column("position", Integer),  # v3: the case's commit's place in the first-parent history
)
Index("ix_cases_sweep", cases.c.sweep_id)
Index("ix_cases_case", cases.c.case_id)

pairs = Table(
    "pairs", metadata,
    Column("sweep_id", Integer, nullable=False),
    Column("case_id", Text, nullable=False),
    Column("pair", Text, nullable=False),
    Column("contract", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("skip", String(32)),
    Column("error", Text),
    Column("failed_checks", Text, nullable=False),  # comma-joined names
)
Index("ix_pairs_sweep", pairs.c.sweep_id)

arms = Table(
    "arms", metadata,
    Column("sweep_id", Integer, nullable=False),
    Column("case_id", Text, nullable=False),
    Column("arm", Text, nullable=False),
    Column("status", String(16)),  # the outcome's; None: no outcome.json
    Column("platform", Text, nullable=False),
    Column("ranks", Integer, nullable=False),
    Column("steps", Integer, nullable=False),
    Column("capture", Text),  # the capture line (graph arms)
    Column("problem", Text),
)
Index("ix_arms_sweep", arms.c.sweep_id)

series = Table(  # one row per figure followed over sweeps; figures point at it
    "series", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("case_id", Text, nullable=False),
    Column("kind", String(8), nullable=False),  # "arm" or "pair"
    Column("subject", Text, nullable=False),  # the arm, or the pair
    Column("rank", Integer, nullable=False),
    Column("metric", Text, nullable=False),
    Column("platform", Text, nullable=False),
    UniqueConstraint("case_id", "kind", "subject", "rank", "metric", "platform",
                     name="uq_series_key"),
)
Index("ix_series_metric", series.c.metric)

figures = Table(
    "figures", metadata,
    Column("sweep_id", Integer, nullable=False),
    Column("series_id", Integer, nullable=False),
    Column("started", String(32), nullable=False),  # the sweep's: the last N points by the index
    Column("value", Float, nullable=False),
    # v3: the figure's own noise as the sweep measured it (a step-time median: the standard
    # error from the per-step spread), in the figure's unit; None: not measured
    Column("spread", Float),
)
Index("ix_figures_sweep", figures.c.sweep_id)
Index("ix_figures_series", figures.c.series_id, figures.c.started)

steps = Table(  # v2: per-step figures of small arms (the lowest rank's loss, the slowest step time)
    "steps", metadata,
    Column("sweep_id", Integer, nullable=False),
    Column("case_id", Text, nullable=False),
    Column("arm", Text, nullable=False),
    Column("step", Integer, nullable=False),
    Column("loss", Float),
    Column("grad_norm", Float),
    Column("step_time_s", Float),
    Column("cpu_time_s", Float),  # v3: the slowest rank's process CPU time of the step
)
Index("ix_steps_sweep", steps.c.sweep_id)

# The tables of sweep data, children first (what removing a sweep deletes).
SWEEP_TABLES = (steps, figures, arms, pairs, cases, sweeps)
