"""Where a view's numbers are read from: the records themselves, or a rollup for the whole days
(or hours) inside the window plus the records of the partial ones at its edges. Each source spells
the same measures over its own columns, so a query is written once and its rows from every part
fold together; the totals are the records' exact sums whichever parts were read."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from billing.filters import Selection, where
from billing.store.base import TABLE, UsageStore
from billing.store.failure_rollup import FAILURES
from billing.store.rollups import BUDGET_REFUSED_SQL, DAILY, DAY, HOUR, HOURLY, RATE_LIMITED_SQL, SAVINGS
from billing.timebuckets import Bucketing
from storage.sql_dialect import Params, SqlDialect

_STATUS_COUNTS = ("ok", "cancelled", "error", "rejected")


class Source:
    def __init__(self, table: str, time_column: str, period: int, dims: frozenset[str], *, count: str,
                 null_user: str, rate_limited: str, budget_refused: str, cold: tuple[str, str, str],
                 output: str, savings: str, cached_price: str, batched: str) -> None:
        self.table, self.time_column, self.period, self.dims = table, time_column, period, dims
        self.requests, self.null_user = count, null_user
        self.rate_limited, self.budget_refused = rate_limited, budget_refused  # 429s of rate limits; budgets
        self.cold = cold  # requests that waited, their total wait, the longest
        self.output = output  # billed output tokens; {greatest} is the dialect's GREATEST(compute, completion)
        self.savings = savings  # cached tokens, batch lines, their cost, cache and batch savings (UsageRow's order)
        self.cached_price, self.batched = cached_price, batched  # a statement line's cached price; 1 for batch lines

    def where(self, selection: Selection, params: Params) -> str:
        return where(selection, params, time_column=self.time_column, null_user=self.null_user)

    def row_sums(self) -> str:
        """A usage row's sums (`UsageRow`'s order): requests, prompt, completion, compute tokens, cost, cached tokens,
        batch lines, batch cost, saved by the cache, saved by the batch rate."""
        return (f"{self.requests}, SUM(prompt_tokens), SUM(completion_tokens), SUM(compute_tokens), "
                f"SUM(cost_micros), {self.savings}")

    def sums(self) -> str:
        """`row_sums` and how the requests ended, as `Sums.of` reads them."""
        one = "1" if self.requests == "COUNT(*)" else "requests"
        ended = ", ".join(f"SUM(CASE WHEN status = '{s}' THEN {one} ELSE 0 END)" for s in _STATUS_COUNTS)
        return f"{self.row_sums()}, {ended}, {self.rate_limited}, {self.budget_refused}"

    def series(self) -> str:
        """`row_sums`, rate limits' 429s, budget refusals, and cold starts: count, total wait, longest wait (0 when
        none)."""
        return f"{self.row_sums()}, {self.rate_limited}, {self.budget_refused}, {', '.join(self.cold)}"

    def output_tokens(self, dialect: SqlDialect) -> str:
        return self.output.format(greatest=dialect.greatest("compute_tokens", "completion_tokens"))

    def usable(self, selection: Selection, bucketing: Bucketing | None = None, grouped: tuple[str, ...] = ()) -> bool:
        """Whether this source can answer the selection (bucket it, and group it by the `grouped` columns) exactly."""
        if any(column not in self.dims for column in [*(c for c, _ in selection.filters.columns()), *grouped]):
            return False
        return bucketing is None or self.period == 0 or bucketing.aligned(self.period)


_ALL_DIMS = frozenset({"model", "key_id", "user_id", "dialect", "status", "error_status", "adapter"})
# the caller's end users and tags are the records' only: a view filtered by them reads the records
RAW = Source(TABLE, "time", 0, _ALL_DIMS | {"end_user", "tags"}, count="COUNT(*)", null_user="user_id IS NULL",
             rate_limited=RATE_LIMITED_SQL, budget_refused=BUDGET_REFUSED_SQL,
             cold=("COUNT(cold_start_ms)", "COALESCE(SUM(cold_start_ms), 0)", "COALESCE(MAX(cold_start_ms), 0)"),
             output="SUM({greatest})", savings=", ".join(expr for _, expr in SAVINGS),
             cached_price="COALESCE(cached_input_price_micros, input_price_micros)",
             batched="CASE WHEN batch_id IS NULL THEN 0 ELSE 1 END")
_ROLLUP_SAVINGS = ", ".join(f"SUM({column})" for column, _ in SAVINGS)
_ROLLUP_COLD = ("SUM(cold_starts)", "SUM(cold_start_ms_total)", "MAX(cold_start_ms_max)")
DAILY_ROLLUP = Source(DAILY, "period", DAY, _ALL_DIMS, count="SUM(requests)", null_user="user_id = ''",
                      rate_limited="SUM(CASE WHEN error_status = 429 THEN requests - budget_refused ELSE 0 END)",
                      budget_refused="SUM(budget_refused)", cold=_ROLLUP_COLD,
                      output="SUM(output_tokens)", savings=_ROLLUP_SAVINGS,
                      cached_price="cached_input_price_micros", batched="batched")
# no user (so no user filter) and no prices (so no statements)
HOURLY_ROLLUP = Source(HOURLY, "period", HOUR, frozenset({"model"}), count="SUM(requests)", null_user="",
                       rate_limited="SUM(rate_limited)", budget_refused="SUM(budget_refused)", cold=_ROLLUP_COLD,
                       output="", savings=_ROLLUP_SAVINGS, cached_price="", batched="")


# failed requests only, by status and HTTP error status (0: none): the failures by status of hourly buckets
HOURLY_FAILURES = Source(FAILURES, "period", HOUR, frozenset({"model", "status", "error_status"}),
                         count="SUM(requests)", null_user="", rate_limited="", budget_refused="", cold=("", "", ""),
                         output="", savings="", cached_price="", batched="")


def split(selection: Selection, source: Source) -> list[tuple[Source, Selection]]:
    """The parts that together cover the selection's window exactly once."""
    if source.period == 0:
        return [(RAW, selection)]
    first = -(-selection.start // source.period) * source.period  # exact on floats, as the writer's `//`
    last = selection.end // source.period * source.period
    if first >= last:
        return [(RAW, selection)]
    edges = [selection.narrowed(selection.start, first), selection.narrowed(last, selection.end)]
    return [(source, selection.narrowed(first, last)), *((RAW, e) for e in edges if e.start < e.end)]


def for_totals(selection: Selection) -> list[tuple[Source, Selection]]:
    """Parts for sums that ignore time buckets (tiles, breakdowns, rankings)."""
    return split(selection, DAILY_ROLLUP)


def for_buckets(selection: Selection, bucketing: Bucketing, *grouped: str) -> list[tuple[Source, Selection]]:
    """Parts for sums grouped by `bucketing`'s buckets (and the `grouped` columns): the coarsest rollup whose
    periods fit them and that holds those columns."""
    for source in (DAILY_ROLLUP, HOURLY_ROLLUP):
        if source.usable(selection, bucketing, grouped):
            return split(selection, source)
    return [(RAW, selection)]


def for_failures(selection: Selection, bucketing: Bucketing) -> list[tuple[Source, Selection]]:
    """Parts for failed requests counted by (bucket, status, error status)."""
    for source in (DAILY_ROLLUP, HOURLY_FAILURES):
        if source.usable(selection, bucketing, ("status", "error_status")):
            return split(selection, source)
    return [(RAW, selection)]


QueryText = Callable[[Source, Selection, Params], str]  # one part's SQL


async def fetch_parts(store: UsageStore, parts: list[tuple[Source, Selection]],
                      statement: QueryText) -> list[tuple[Any, ...]]:
    """Every part's rows of `statement(source, selection, params)`, run side by side."""
    async def one(source: Source, selection: Selection) -> list[tuple[Any, ...]]:
        params = Params(store.dialect)
        return await store.fetch(statement(source, selection, params), params.values)

    results = await asyncio.gather(*(one(source, selection) for source, selection in parts))
    return [row for rows in results for row in rows]
