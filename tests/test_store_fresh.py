"""A new database gets its schema in one script (store/fresh_schema.py), ~12x cheaper than the
migrations one by one: it must be exactly what the migrations build."""

from __future__ import annotations

import sqlite3

from gpuwatch.store import fresh_schema, open_rw, schema_dump
from gpuwatch.store.schema import SCHEMA_VERSION


def _schema(conn: sqlite3.Connection) -> list[tuple]:
    """Every object, shadow tables and SQLite's own indexes included, as SQLite stores it."""
    return sorted(conn.execute("SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_master"))


def test_the_fresh_schema_is_current_with_the_migrations():
    assert schema_dump.TARGET.read_text() == schema_dump.render(
        schema_dump.statements(schema_dump.migrated())
    ), "store/fresh_schema.py is out of date with MIGRATIONS: run `python -m gpuwatch.store.schema_dump`"


def test_a_new_database_is_what_the_migrations_build(tmp_path):
    new = open_rw(tmp_path / "new.db")
    assert _schema(new) == _schema(schema_dump.migrated())
    assert new.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert [v for (v,) in new.execute("SELECT version FROM migrations ORDER BY version")] == list(
        range(1, SCHEMA_VERSION + 1)
    )
    # What the script made works as the migrations' does: the runs' search index follows inserts.
    new.execute(
        "INSERT INTO runs (run_id, uid, name, status, started_ms) VALUES ('r1', 1000, 'llama-8k', 'running', 1)"
    )
    assert new.execute("SELECT rowid FROM runs_fts WHERE runs_fts MATCH 'llama'").fetchall() == [(1,)]


def test_a_stale_fresh_schema_is_not_used(tmp_path, monkeypatch):
    """A migration added and the script not written again: new databases are migrated one by one."""
    monkeypatch.setattr(fresh_schema, "STATEMENTS", ("CREATE TABLE not_the_schema (x)",))
    monkeypatch.setattr(fresh_schema, "VERSION", SCHEMA_VERSION - 1)
    new = open_rw(tmp_path / "new.db")
    assert _schema(new) == _schema(schema_dump.migrated())
