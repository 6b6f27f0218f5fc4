"""The usage API's grouped sums (`GET /v1/usage`, `/admin/usage`)."""

from __future__ import annotations

from billing.filters import NO_USER, where
from billing.insights.sums import ROW_SUMS_SQL
from billing.store.base import TABLE, UsageStore
from billing.store.sql import Params
from billing.timebuckets import Bucketing
from billing.usage import UsageQuery, UsageReport, UsageRow

# group_by -> column; a fixed whitelist, never user text in SQL
GROUP_COLUMNS = {"model": "model", "key": "key_id", "user": "user_id", "team": "team_id", "dialect": "dialect",
                 "status": "status"}


def _row(key: str, values) -> UsageRow:
    return UsageRow(key, *(int(v) for v in values))


async def usage_report(store: UsageStore, query: UsageQuery) -> UsageReport:
    params = Params(store.dialect)
    condition = where(query.selection, params)
    if query.group_by in ("day", "hour"):
        bucketing = Bucketing(query.group_by, query.tz, query.start, query.end)
        key, span = bucketing.sql(store.dialect)
        result = await store.fetch(f"SELECT {key} AS k, {span} AS s, {ROW_SUMS_SQL} FROM {TABLE} "
                                   f"WHERE {condition} GROUP BY k, s", params.values)
        rows: dict[str, tuple[float, UsageRow]] = {}
        for k, s, *values in result:
            bucket = bucketing.bucket(k, s)
            start, row = rows.setdefault(bucket.label, (bucket.start, UsageRow(bucket.label)))
            row.add(_row(bucket.label, values))  # a day that a DST change cut in two spans is one row
        return UsageReport.from_rows([row for _, row in sorted(rows.values(), key=lambda item: item[0])])
    if query.group_by == "none":
        (values,) = await store.fetch(f"SELECT {ROW_SUMS_SQL} FROM {TABLE} WHERE {condition}", params.values)
        return UsageReport.from_rows([_row("", values)] if values[0] else [])
    column = GROUP_COLUMNS[query.group_by]
    result = await store.fetch(f"SELECT {column}, {ROW_SUMS_SQL} FROM {TABLE} WHERE {condition} GROUP BY {column}",
                               params.values)
    # sorted here, not in SQL: PostgreSQL's collation would order differently from SQLite's bytes
    return UsageReport.from_rows(sorted((_row(NO_USER if k is None else k, values) for k, *values in result),
                                        key=lambda r: r.key))
