"""The budget book (gateway/limits/budgets.py) on both backends: counters seeded once from the ledger (a seeder
here), reservations all or none that no concurrency can push past a limit, settlement to the real amount with the
settled figures alerts compare with, and a second book (a restarted gateway, another one of the fleet) that resumes
from the same figures."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gateway.limits.budget_model import BudgetLine, BudgetSpent
from gateway.limits.budgets import open_book


def line(scope: str = "key:a", limit: int | None = 100, measure: str = "tokens") -> BudgetLine:
    return BudgetLine(scope, measure, "month", "2026-12", 1_795_000_000.0, 1_798_761_600.0, limit)


class Ledger:
    """What the seeder reads: a fixed sum per budget line, and how often it was asked."""

    def __init__(self, sums: dict[str, int] | None = None):
        self.sums, self.reads = sums or {}, 0

    async def __call__(self, budget: BudgetLine) -> int:
        self.reads += 1
        await asyncio.sleep(0.01)  # a real read yields to other requests
        return self.sums.get(budget.scope, 0)


@pytest.fixture(params=["memory", "redis"])
def url(request) -> str | None:
    return request.getfixturevalue("redis").url if request.param == "redis" else None


@pytest.fixture
def prefix() -> str:
    return f"t:{uuid.uuid4().hex}"


async def test_a_counter_starts_from_the_ledger_and_refuses_past_its_limit(url, prefix):
    ledger = Ledger({"key:a": 60})
    book = open_book(url, ledger, key_prefix=prefix)
    try:
        hold = await book.reserve([line()], [30])  # 60 + 30 <= 100
        with pytest.raises(BudgetSpent) as spent:
            await book.reserve([line()], [11])
        assert (spent.value.settled, spent.value.in_flight, spent.value.asked) == (60, 30, 11)
        assert await book.settle(hold, [5]) == [(line(), 60, 65)]  # 25 reserved-but-unused come back
        assert await book.settle(hold, [5]) == []  # a second settle is a no-op
        await book.reserve([line()], [35])
        with pytest.raises(BudgetSpent) as never:
            await book.reserve([line()], [101])
        assert never.value.never
        assert ledger.reads == 1
    finally:
        await book.close()


async def test_all_budgets_of_a_request_or_none(url, prefix):
    book = open_book(url, Ledger({"team:t": 95}), key_prefix=prefix)
    try:
        with pytest.raises(BudgetSpent) as spent:
            await book.reserve([line("key:a"), line("team:t")], [10, 10])
        assert spent.value.line.scope == "team:t"
        await book.reserve([line("key:a")], [100])  # the key's reservation was not kept
        await book.reserve([line("team:t", limit=None)], [10**9])  # a soft budget counts, never refuses
    finally:
        await book.close()


async def test_concurrent_requests_never_pass_a_budget(url, prefix):
    ledger = Ledger({"key:a": 10})
    book = open_book(url, ledger, key_prefix=prefix)
    try:
        results = await asyncio.gather(*(book.reserve([line()], [20]) for _ in range(16)), return_exceptions=True)
        assert sum(not isinstance(r, BaseException) for r in results) == 4  # 10 + 4 x 20 <= 100 < 10 + 5 x 20
        assert all(isinstance(r, BudgetSpent) for r in results if isinstance(r, BaseException))
        assert ledger.reads == 1  # one read of the ledger however many requests needed it at once
    finally:
        await book.close()


async def test_a_second_book_resumes_where_the_first_stood(url, prefix):
    """A restarted gateway (memory: seeded again from the ledger, which holds what the first one settled) or a
    second gateway of the fleet (Redis: the same counter) refuses at the same figure."""
    ledger = Ledger()
    first = open_book(url, ledger, key_prefix=prefix)
    hold = await first.reserve([line()], [50])
    await first.settle(hold, [90])  # an overrun is charged in full
    await first.close()
    ledger.sums["key:a"] = 90  # what the first gateway's records put in the ledger
    second = open_book(url, ledger, key_prefix=prefix)
    try:
        with pytest.raises(BudgetSpent) as spent:
            await second.reserve([line()], [11])
        assert spent.value.settled == 90
    finally:
        await second.close()


async def test_a_ledger_that_cannot_be_read_admits_nothing_and_is_read_again(url, prefix):
    class Failing(Ledger):
        async def __call__(self, budget):
            self.reads += 1
            if self.reads == 1:
                raise OSError("store away")
            return 0

    ledger = Failing()
    book = open_book(url, ledger, key_prefix=prefix)
    try:
        with pytest.raises(OSError):
            await book.reserve([line()], [1])
        await book.reserve([line()], [1])
        assert ledger.reads == 2
    finally:
        await book.close()
