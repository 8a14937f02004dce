"""Full-text search over runs and their notes (SQLite FTS5, made by sqlite-utils).

`runs_fts` indexes each run's name, command, config, git commit and cwd; `run_notes_fts`
indexes the notes people leave on runs. sqlite-utils' `enable_fts(..., create_triggers=True)`
builds both, fills them from the rows already there (an old database gets its runs indexed
when it is migrated) and adds the triggers that keep them current on every insert, update and
delete, whichever process writes. The runs update trigger is narrowed to the indexed columns:
the writer updates `last_step_ms` with every batch of steps, which must not re-index the run.
"""

from __future__ import annotations

import re
import sqlite3

from gpuwatch.store.sqlite_utils_db import sqlite_utils_database

RUN_COLUMNS = ("name", "command", "config_json", "git_commit", "cwd")

NOTES_SQL = """
CREATE TABLE run_notes (                 -- notes left on a run by its owner (or root)
  id INTEGER PRIMARY KEY,
  run_id TEXT NOT NULL,
  ts_ms INTEGER NOT NULL,
  uid INTEGER NOT NULL,                  -- who wrote it: from SO_PEERCRED, never from the message
  user TEXT,
  text TEXT NOT NULL,
  UNIQUE (run_id, ts_ms, uid)            -- a re-sent note is stored once
);
"""


def add_search(conn: sqlite3.Connection) -> None:
    """The migration: `runs` gets a stable integer key, then the notes table and both FTS
    indexes with their triggers.

    The runs index refers to runs by rowid, and a VACUUM may renumber an implicit rowid, which
    would point the index at the wrong runs: `runs` needs an INTEGER PRIMARY KEY. ALTER TABLE
    cannot change a primary key; sqlite-utils' `transform()` rebuilds the table with one (the
    columns, their order and the indexes kept) and `run_id` stays unique."""
    with sqlite_utils_database(conn) as db:
        conn.execute("ALTER TABLE runs ADD COLUMN id INTEGER")
        conn.execute("UPDATE runs SET id = rowid")
        db["runs"].transform(pk="id", not_null={"run_id"})
        conn.execute("CREATE UNIQUE INDEX runs_run_id ON runs(run_id)")  # it was the primary key
        conn.execute(NOTES_SQL.strip())
        db["runs"].enable_fts(RUN_COLUMNS, create_triggers=True)
        db["run_notes"].enable_fts(["text"], create_triggers=True)
        cols = ", ".join(RUN_COLUMNS)
        old = ", ".join(f"old.{c}" for c in RUN_COLUMNS)
        new = ", ".join(f"new.{c}" for c in RUN_COLUMNS)
        conn.execute("DROP TRIGGER runs_au")
        conn.execute(
            f"CREATE TRIGGER runs_au AFTER UPDATE OF {cols} ON runs BEGIN "
            f"INSERT INTO runs_fts (runs_fts, rowid, {cols}) VALUES ('delete', old.rowid, {old}); "
            f"INSERT INTO runs_fts (rowid, {cols}) VALUES (new.rowid, {new}); END"
        )


def match_expression(text: str) -> str:
    """What a user types -> an FTS5 query: each word a quoted phrase, its last token a prefix,
    all words required. Quoting keeps '=', '-', '.' literal (FTS5 would read `lr=3e-4` as
    syntax); the tokenizer splits a word at them, so `lr=3e-4` matches `--lr 3e-4` or
    `--lr=3e-4` in a command, and `abc12` any commit starting so. Values match as written:
    a config saved as JSON holds 3e-4 as 0.0003."""
    words = [w for w in re.split(r"\s+", text.strip()) if w]
    return " ".join('"' + w.replace('"', '""') + '"*' for w in words)


# A WHERE condition on `runs`: its indexed columns or one of its notes match (parameter given twice).
MATCHES = (
    "(rowid IN (SELECT rowid FROM runs_fts WHERE runs_fts MATCH ?) "
    "OR run_id IN (SELECT run_id FROM run_notes WHERE id IN "
    "(SELECT rowid FROM run_notes_fts WHERE run_notes_fts MATCH ?)))"
)
