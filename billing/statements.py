"""A team's monthly statement: one line item per model and price, at the price in force when each
request ran (every ledger record carries its prices). A price change within the month therefore
gives that model two line items, each with its own price and its own dates. A line's amount is the
sum of its requests' costs, each rounded to the micro-unit when the ledger priced it, so the
statement's total equals the usage API's cost for the month to the micro-unit. A line is also one cached-input
price, one batch discount, and batch lines or interactive requests (never both): a team reads its batch spend and
what the prefix cache and the batch rate saved it line by line."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import msgspec

from billing.filters import Selection
from billing.insights.sources import Source, fetch_parts, for_totals
from billing.store.base import UsageStore
from billing.usage import micros_to_decimal
from storage.sql_dialect import Params

_MONTH = re.compile(r"([0-9]{4})-([0-9]{2})")  # ASCII digits: `\d` takes "٢٠٢٦-١١" too


class StatementLine(msgspec.Struct):
    model: str
    input_price_micros: int  # per million prompt tokens
    output_price_micros: int  # per million output tokens
    requests: int
    prompt_tokens: int
    output_tokens: int  # billed generated tokens: compute tokens (beams, best_of) or completion, the larger
    cost_micros: int
    cost: str  # the same amount as a decimal string
    first_day: str  # the first and last UTC day this month when a request paid this price
    last_day: str
    # schema 8: the cached-input price and batch discount of the line, whether its requests were batch lines (a batch
    # line and an interactive one of the same model are two lines), its cached prompt tokens, and what the cache and
    # the batch discount saved against the list prices (list cost = cost + both)
    cached_input_price_micros: int = 0
    batch_discount_percent: int = 0
    batch: bool = False
    cached_tokens: int = 0
    cache_saved_micros: int = 0
    batch_saved_micros: int = 0


class Statement(msgspec.Struct):
    team_id: str
    month: str  # "2025-03", a UTC calendar month
    start: float
    end: float
    lines: list[StatementLine]  # by model, interactive before batch, then by when each price was first used
    total_micros: int
    total: str
    batch_micros: int = 0  # of the total, what batch lines cost
    cache_saved_micros: int = 0  # the lines' savings, summed
    batch_saved_micros: int = 0


def month_window(month: str) -> tuple[float, float]:
    """[first instant, next month's first instant) of "YYYY-MM" (UTC); ValueError otherwise."""
    match = _MONTH.fullmatch(month)
    if not match or not 1 <= int(match[2]) <= 12 or int(match[1]) < 1970:
        raise ValueError(f"month must look like 2025-03, got {month!r}")
    year, number = int(match[1]), int(match[2])
    first = datetime(year, number, 1, tzinfo=UTC)
    following = datetime(year + number // 12, number % 12 + 1, 1, tzinfo=UTC)
    return first.timestamp(), following.timestamp()


async def monthly_statement(store: UsageStore, team_id: str, month: str) -> Statement:
    start, end = month_window(month)

    def statement(source: Source, part: Selection, params: Params) -> str:
        prices = f"model, input_price_micros, output_price_micros, {source.cached_price}, batch_discount_percent"
        return (f"SELECT {prices}, {source.batched} AS b, {source.requests}, SUM(prompt_tokens), "
                f"{source.output_tokens(store.dialect)}, SUM(cost_micros), MIN({source.time_column}), "
                f"MAX({source.time_column}), {source.savings} FROM {source.table} WHERE {source.where(part, params)} "
                f"GROUP BY {prices}, b")

    lines: dict[tuple[Any, ...], StatementLine] = {}
    for (model, price_in, price_out, price_cached, discount, batched, n, prompt, out, cost, first, last, cached,
         _batch_n, _batch_cost, cache_saved, batch_saved) in await fetch_parts(
            store, for_totals(Selection(start, end, team_id)), statement):
        key = (model, int(price_in), int(price_out), int(price_cached), int(discount), bool(batched))
        line = lines.get(key)
        if line is None:
            line = lines[key] = StatementLine(model, key[1], key[2], 0, 0, 0, 0, "", _day(first), _day(last),
                                              key[3], key[4], key[5])
        line.requests += int(n)
        line.prompt_tokens += int(prompt)
        line.output_tokens += int(out)
        line.cost_micros += int(cost)
        line.cached_tokens += int(cached)
        line.cache_saved_micros += int(cache_saved)
        line.batch_saved_micros += int(batch_saved)
        line.first_day, line.last_day = min(line.first_day, _day(first)), max(line.last_day, _day(last))
    ordered = sorted(lines.values(), key=lambda line: (line.model, line.batch, line.first_day,
                                                       line.input_price_micros, line.output_price_micros,
                                                       line.cached_input_price_micros, line.batch_discount_percent))
    for line in ordered:
        line.cost = micros_to_decimal(line.cost_micros)
    total = sum(line.cost_micros for line in ordered)
    return Statement(team_id, month, start, end, ordered, total, micros_to_decimal(total),
                     sum(line.cost_micros for line in ordered if line.batch),
                     sum(line.cache_saved_micros for line in ordered), sum(line.batch_saved_micros for line in ordered))


def _day(unix: float) -> str:
    return datetime.fromtimestamp(float(unix), UTC).date().isoformat()
