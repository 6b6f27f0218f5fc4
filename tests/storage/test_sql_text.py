"""The stores' one SQL (storage/sql_text.py): `?` / `?N` parameters numbered for PostgreSQL, row locks dropped for
SQLite, literals and comments untouched, every other placeholder scheme refused; then the same statements run on
both real databases; then a scan of the stores for SQL that only one backend reads, or a branch on the backend."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import storage
from storage.sql_text import postgres, sqlite

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("written", "numbered"), [
    ("SELECT a FROM t WHERE b = ? AND c = ?", "SELECT a FROM t WHERE b = $1 AND c = $2"),
    ("SELECT ?2, ?1, ?1", "SELECT $2, $1, $1"),
    ("SELECT ?2, ?", "SELECT $2, $3"),  # SQLite's rule: `?` is one past the largest number so far
    ("SELECT ?::text[], ?1::int8", "SELECT $1::text[], $1::int8"),  # a cast right after
    ("SELECT 'it''s ?', ? FROM t", "SELECT 'it''s ?', $1 FROM t"),  # a `?` in a literal, with a quote escaped
    ("SELECT \"who?\" FROM t WHERE x = ?", "SELECT \"who?\" FROM t WHERE x = $1"),  # a quoted identifier
    ("SELECT ? -- why?\n, ? /* ?, ? */", "SELECT $1 -- why?\n, $2 /* ?, ? */"),  # comments
    ("SELECT $$ ? $$, $tag$ ? $tag$, ?", "SELECT $$ ? $$, $tag$ ? $tag$, $1"),  # dollar quoting
    ("SELECT x::text, '10:30' FROM t", "SELECT x::text, '10:30' FROM t"),  # a cast and a time are no names
])
def test_postgres_numbers_the_parameters_outside_literals(written, numbered):
    assert postgres(written) == numbered


@pytest.mark.parametrize(("written", "translated"), [
    ("SELECT a FROM t LIMIT 1 FOR UPDATE SKIP LOCKED", "SELECT a FROM t LIMIT 1"),
    ("SELECT a FROM t WHERE id = ? FOR UPDATE", "SELECT a FROM t WHERE id = ?"),
    ("SELECT a FROM t for update nowait", "SELECT a FROM t"),
    ("SELECT 'FOR UPDATE' FROM t FOR UPDATE", "SELECT 'FOR UPDATE' FROM t"),  # the literal stays
    ("SELECT ?1, ?2 FROM t -- FOR UPDATE", "SELECT ?1, ?2 FROM t -- FOR UPDATE"),
])
def test_sqlite_drops_row_locks_and_keeps_the_rest(written, translated):
    assert sqlite(written) == translated
    assert postgres(written).endswith(written.rsplit(" ", 1)[-1])  # PostgreSQL keeps its lock


@pytest.mark.parametrize("written", ["SELECT $1", "SELECT a FROM t WHERE b = :name", "SELECT %s", "SELECT %(b)s",
                                     "SELECT @b", "SELECT ?0", "SELECT 'open", 'SELECT "open', "SELECT /* open"])
def test_other_schemes_and_unclosed_quotes_are_refused_for_both(written):
    with pytest.raises(ValueError):
        postgres(written)
    if "?0" not in written:  # SQLite numbers from 1 itself
        with pytest.raises(ValueError):
            sqlite(written)


async def test_the_one_sql_runs_on_both_databases(database_url):
    db = await storage.open(database_url)
    try:
        await db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL, owner TEXT)")
        await db.execute("INSERT INTO notes (id, body, owner) VALUES (?, 'why?', ?)", (1, "ann"))
        await db.execute("INSERT INTO notes (id, body, owner) VALUES (?2, ?1, ?1)", ("bo", 2))
        assert await db.fetchall("SELECT id, body, owner FROM notes WHERE body = 'why?' OR owner = ?2 "
                                 "OR body = ?1 OR owner = ?2 ORDER BY id -- which?", ("none", "bo")) == [
            (1, "why?", "ann"), (2, "bo", "bo")]
        async with db.transaction() as tx:
            row = await tx.fetchone("SELECT id FROM notes WHERE owner = ? ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
                                    ("ann",))
        assert row == (1,)
        assert db.sql.name == {"sqlite": "sqlite", "postgres": "postgresql"}[db.dialect]
        assert await db.fetchall(f"SELECT {db.sql.greatest('id', '?')} FROM notes ORDER BY id", (2,)) == [(2,), (2,)]
    finally:
        await db.close()


# the store modules: every module above storage that opens a database, runs a statement or assembles one
_RUNS_SQL = re.compile(r"\bstorage\b|Params\(|\.fetch(all|one)?\(|\.execute(many)?\(|\.read\(")
STORES = [path for package in ("auth", "billing", "gateway") for path in sorted((REPO / package).rglob("*.py"))
          if _RUNS_SQL.search(path.read_text())]
# `:name` and `@name` are refused by the translation too (test above); in source they are too like JSON to scan for
FOREIGN = re.compile(r"\$[0-9]+|%s\b|%\(\w+\)s")
SQL_WORDS = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|WHERE|VALUES|RETURNING)\b")
BRANCH = re.compile(r"""dialect\s*[!=]=\s*["'](sqlite|postgres)|dialect\.name\s*[!=]=|["']postgresql["']\s*[!=]=""")
# branches on the backend that are no SQL spelling: what is stored where, or which store class runs
NOT_SQL = {
    "billing/store/__init__.py": "the SQLite and PostgreSQL usage stores insert their batches in their own way",
    "gateway/batches/bodies.py": "batch file bodies: on disk beside SQLite, in the database on PostgreSQL",
    "gateway/dialects/responses/store.py": "the free-disk floor of a SQLite file (PostgreSQL has no file of ours)",
}


def _strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module (f-strings' literal parts too; docstrings left out), with their lines."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_store_writes_another_placeholder_scheme():
    found = [f"{path.relative_to(REPO)}:{line}: {text.strip()[:60]}" for path in STORES
             for line, text in _strings(path) if FOREIGN.search(text) and SQL_WORDS.search(text)]
    assert found == []


def test_no_store_branches_on_the_backend_for_its_sql():
    found = {str(path.relative_to(REPO)) for path in STORES if BRANCH.search(path.read_text())}
    assert found == set(NOT_SQL)
