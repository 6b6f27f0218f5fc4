"""Tenants take turns at the free rows (worker/engine/fair_turns.py): one tenant's many waiting requests do not
hold another tenant's first request behind all of them."""

from __future__ import annotations

from collections import Counter

import pytest

from common.protocol import Accepted
from tests.worker.engine.runs import Run, request, running_engine
from worker.engine.fair_turns import FairTurns
from worker.engine.sequence import RequestState


@pytest.fixture(scope="module")
def one_row_engine(smol):
    with running_engine(smol, "fair-turns", max_batch_size=1, max_context=256) as running:
        yield running


def test_a_small_tenant_starts_before_a_big_tenants_remaining_requests(one_row_engine):
    started: list[str] = []

    def submit(tenant: str) -> Run:
        run = Run()
        generate = request("Count:", max_tokens=6, temperature=0.0, ignore_eos=True, tenant=tenant)

        def sink(batch: list) -> None:
            if any(isinstance(event, Accepted) for event in batch):
                started.append(tenant)
            run.sink(batch)

        one_row_engine.submit(one_row_engine.prepare(generate), sink)
        return run

    runs = [submit("big") for _ in range(6)] + [submit("small")]
    for run in runs:
        run.wait()
    # one row: "big" may have started one or two requests before "small" arrived, never all six
    assert started.index("small") <= 2, started
    assert Counter(started) == {"big": 6, "small": 1}


def test_waiting_tenants_alternate_counting_rows(one_row_engine):
    def state(tenant: str) -> RequestState:
        return RequestState(one_row_engine.prepare(request("Hi", max_tokens=1, tenant=tenant)), lambda _: None)

    waiting = {"a1": state("a"), "a2": state("a"), "a3": state("a"), "b1": state("b"), "b2": state("b"),
               "c1": state("c")}
    names = {id(s): name for name, s in waiting.items()}
    turns = FairTurns()

    def order(running: Counter) -> list[str]:
        return [names[id(s)] for s in turns.order(waiting.values(), running)]

    # ranks (rows the tenant runs + its rows waiting ahead): a 0 1 2, b 0 1, c 2 (two running); ties by arrival
    assert order(Counter({(False, "c"): 2})) == ["a1", "b1", "a2", "b2", "a3", "c1"]
    turns.started(waiting.pop("a1"))  # a1 ran and finished: a and b rank alike again, but b's turn is older
    assert order(Counter()) == ["b1", "c1", "a2", "b2", "a3"]
