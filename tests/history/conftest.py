"""The history tests run against SQLite always and against PostgreSQL when
``DCP_HARNESS_TEST_POSTGRES`` names a server (CI: .ci/postgres.sh starts one): each test then
gets a database of its own on it, dropped afterwards. Set but unreachable is a failure, not a
skip."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Iterator

import pytest

PG_ENV = "DCP_HARNESS_TEST_POSTGRES"
NO_SERVER = (f"{PG_ENV} is not set: the PostgreSQL history tests need a server (CI starts one "
             "with .ci/postgres.sh; locally run that script, or set the variable to a server URL)")


def _postgres_database(server: str) -> Iterator[str]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"history_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(server).set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty history database: a SQLite file, or a database on the test server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'history.sqlite'}"
        return
    server = os.environ.get(PG_ENV)
    if not server:
        pytest.skip(NO_SERVER)
    yield from _postgres_database(server)
