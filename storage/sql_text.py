"""The one SQL every store writes, and its translation per backend: the only place that knows how SQLite and
PostgreSQL spell parameters and row locks.

Stores write SQLite's positional parameters: `?` (the next number) or `?N` (number N, so one value can be used
twice and a query assembled in any order: billing's `Params`). PostgreSQL gets them numbered `$N`. Row locks
(`FOR UPDATE`, `FOR UPDATE SKIP LOCKED`, `FOR UPDATE NOWAIT`) are written as PostgreSQL spells them; SQLite drops
them, since its every transaction is exclusive (storage/sqlite.py) and so already holds every row it reads.

Text inside string literals ('it''s ?'), quoted identifiers ("a?"), dollar-quoted bodies ($$ ? $$) and comments
is never changed. Any other placeholder scheme (`$1`, `:name`, `@name`, `%s`) is refused with `ValueError`, so
a store cannot write SQL that only one backend understands.
"""

from __future__ import annotations

import functools
import re

# one token at a time: a literal or comment (kept whole), a placeholder, a word, or any other character
_TOKEN = re.compile(r"""
    (?P<literal>'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*|/\*.*?\*/|(?P<tag>\$[A-Za-z_]*\$).*?(?P=tag))
  | (?P<mark>\?(?P<number>[0-9]*))
  | (?P<foreign>\$[0-9]+|(?<![:\w]):[A-Za-z_]\w*|@[A-Za-z_]\w*|%\(?\w*\)?s)
  | (?P<word>[A-Za-z_]\w*)
  | (?P<other>.)
""", re.S | re.X)
_ROW_LOCK = re.compile(r"\s+FOR\s+UPDATE(\s+(SKIP\s+LOCKED|NOWAIT))?(?=\s*(;|$|\)))", re.I)


def _tokens(sql: str) -> list[re.Match[str]]:
    tokens = list(_TOKEN.finditer(sql))
    if sum(len(token.group(0)) for token in tokens) != len(sql):  # never: `other` takes any character
        raise ValueError(f"cannot read this SQL: {sql[:80]!r}")
    return tokens


def _refuse(token: re.Match[str], sql: str) -> None:
    raise ValueError(f"write `?` or `?N` parameters, not {token.group('foreign')!r} (storage/sql_text.py): "
                     f"{sql[:80]!r}")


@functools.lru_cache(maxsize=1024)
def postgres(sql: str) -> str:
    """`sql` with its parameters numbered as PostgreSQL's ($1, $2...): `?` takes the number after the largest
    used so far (SQLite's rule), `?N` is $N."""
    out: list[str] = []
    largest = 0
    for token in _tokens(sql):
        if token.group("mark") is not None:
            number = int(token.group("number")) if token.group("number") else largest + 1
            if number < 1:
                raise ValueError(f"parameter ?{number} does not exist; they count from ?1: {sql[:80]!r}")
            largest = max(largest, number)
            out.append(f"${number}")
        elif token.group("foreign") is not None:
            _refuse(token, sql)
        else:
            _unclosed(token, sql)
            out.append(token.group(0))
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def sqlite(sql: str) -> str:
    """`sql` for SQLite: parameters as written, row locks dropped (outside literals and comments)."""
    out: list[str] = []
    code: list[str] = []  # the text between literals, where a row lock may be
    for token in _tokens(sql):
        if token.group("foreign") is not None:
            _refuse(token, sql)
        if token.group("literal") is not None:
            out.append(_ROW_LOCK.sub("", "".join(code)))
            code = []
            out.append(token.group(0))
        else:
            _unclosed(token, sql)
            code.append(token.group(0))
    out.append(_ROW_LOCK.sub("", "".join(code)))
    return "".join(out)


def _unclosed(token: re.Match[str], sql: str) -> None:
    """A quote or comment opened and never closed would hide the rest of the statement from the translation."""
    if token.group("other") is not None and (token.group(0) in ("'", '"') or sql.startswith("/*", token.start())):
        raise ValueError(f"unclosed quote or comment in SQL: {sql[:80]!r}")
