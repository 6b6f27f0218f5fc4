"""Which ledger rows a view covers: a team (or every team), a window [start, end) and optional
filters. Every query of the usage API and the dashboards narrows rows through `where`, so the same
selection always means the same rows."""

from __future__ import annotations

from typing import Any

import msgspec

from billing.store.base import tag_pattern
from storage.sql_dialect import Params

NO_USER = "-"  # the user of requests made with a service key: a filter value and a breakdown key (ids never are "-")


class Filters(msgspec.Struct, frozen=True, kw_only=True):
    """Each non-empty tuple keeps the rows whose column is one of its values."""

    models: tuple[str, ...] = ()
    key_ids: tuple[str, ...] = ()
    user_ids: tuple[str, ...] = ()  # NO_USER matches rows without a user
    dialects: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    adapters: tuple[str, ...] = ()
    end_users: tuple[str, ...] = ()  # the caller's end user (OpenAI's `user`, Anthropic's `metadata.user_id`)
    tags: tuple[tuple[str, str], ...] = ()  # (key, value) pairs: a row has every one of them

    def columns(self) -> list[tuple[str, tuple[Any, ...]]]:
        """The filtered columns and their values; `tags` (a row has all its pairs) is matched apart, in `where`."""
        return [(c, v) for c, v in (("model", self.models), ("key_id", self.key_ids), ("user_id", self.user_ids),
                                    ("dialect", self.dialects), ("status", self.statuses),
                                    ("adapter", self.adapters), ("end_user", self.end_users),
                                    ("tags", self.tags)) if v]


class Selection(msgspec.Struct, frozen=True):
    start: float  # unix seconds UTC, inclusive
    end: float  # unix seconds UTC, exclusive
    team_id: str | None = None  # None: every team (admin)
    filters: Filters = Filters()

    def narrowed(self, start: float, end: float) -> Selection:
        """The same view over the part of [start, end) inside this window."""
        return msgspec.structs.replace(self, start=max(self.start, start), end=min(self.end, end))


def where(selection: Selection, params: Params, *, time_column: str = "time",
          null_user: str = "user_id IS NULL") -> str:
    """The WHERE condition (without the keyword) selecting the view's rows. A rollup passes the
    column holding its period's start, and how it stores a request without a user."""
    parts = []
    if selection.team_id is not None:
        parts.append(f"team_id = {params(selection.team_id)}")
    parts += [f"{time_column} >= {params(float(selection.start))}", f"{time_column} < {params(float(selection.end))}"]
    dialect = params.dialect
    for column, values in selection.filters.columns():
        if column == "tags":
            parts += [dialect.contains("tags", tag_pattern(key, value), params) for key, value in values]
        elif column == "user_id" and NO_USER in values:
            named = [v for v in values if v != NO_USER]
            named_sql = f"{dialect.one_of(column, named, params)} OR " if named else ""
            parts.append(f"({named_sql}{null_user})")
        else:
            parts.append(dialect.one_of(column, values, params))
    return " AND ".join(parts)
