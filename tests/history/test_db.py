"""Opening the history: the URL's sources, and every database that cannot be used is a clear
error naming what to do, with nothing changed (a damaged file, someone else's tables, a newer
schema, a server that cannot be reached, a file that is not there for a reader)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from harness.cli import main
from harness.history import ENV_VAR, HistoryError, history_url, open_history
from harness.history import schema


def test_the_url_is_the_option_else_the_variable_else_results_history_sqlite(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert history_url(None, {}) == f"sqlite:///{tmp_path / 'results' / 'history.sqlite'}"
    assert history_url(None, {ENV_VAR: "team.db"}) == f"sqlite:///{tmp_path / 'team.db'}"
    assert history_url("postgresql+psycopg://u@h/db", {ENV_VAR: "x.db"}) == "postgresql+psycopg://u@h/db"


def test_a_damaged_file_is_an_error_naming_rebuild_and_is_left_as_it_is(tmp_path: Path, capsys):
    db = tmp_path / "history.sqlite"
    garbage = b"this is not a database\n" * 200
    db.write_bytes(garbage)
    with pytest.raises(HistoryError) as err:
        open_history(str(db))
    assert str(db) in str(err.value) and "file is not a database" in str(err.value)
    assert "`dcp-harness history rebuild DIR...`" in str(err.value)
    assert main(["history", "check", "--history", str(db)]) == 2
    assert "error: cannot read the history database" in capsys.readouterr().err
    assert db.read_bytes() == garbage


def test_someone_elses_database_is_refused_untouched(tmp_path: Path):
    db = tmp_path / "other.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    before = db.read_bytes()
    with pytest.raises(HistoryError, match="holds tables that are not a dcp-harness history "
                                           r"\(invoices\): nothing was changed"):
        open_history(str(db))
    assert db.read_bytes() == before


def test_a_newer_schema_asks_for_a_newer_harness(url: str):
    open_history(url).close()
    history = open_history(url)
    with history.write() as conn:
        conn.execute(schema.meta.update().where(schema.meta.c.key == "schema_version")
                     .values(value=str(schema.SCHEMA_VERSION + 1)))
    history.close()
    with pytest.raises(HistoryError, match=f"schema version {schema.SCHEMA_VERSION + 1}, this "
                                           "dcp-harness reads up to .*: upgrade dcp-harness"):
        open_history(url)


def test_a_server_that_cannot_be_reached_says_what_to_do(capsys):
    url = "postgresql+psycopg://postgres:secret@127.0.0.1:1/history"
    with pytest.raises(HistoryError) as err:
        open_history(url)
    text = str(err.value)
    assert "cannot read the history database at postgresql+psycopg://postgres:***@127.0.0.1:1/" in text
    assert "start the server or fix the URL (--history URL or $DCP_HARNESS_HISTORY)" in text
    assert "secret" not in text
    assert main(["history", "show", "--history", url]) == 2
    assert "start the server or fix the URL" in capsys.readouterr().err


def test_a_reader_does_not_make_an_empty_database(tmp_path: Path, capsys):
    db = tmp_path / "none.sqlite"
    assert main(["history", "show", "--history", str(db)]) == 2
    assert f"no history database at {db}: add sweeps with `dcp-harness history add" in capsys.readouterr().err
    assert not db.exists()


def test_not_a_url_is_named():
    with pytest.raises(HistoryError, match="is not a database URL"):
        open_history("postgresql+psycopg://u@h:notaport/db")
