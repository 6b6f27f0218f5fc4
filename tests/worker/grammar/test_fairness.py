"""Grammar compiles are shared fairly among tenants (fair_queue.py): one tenant's heavy distinct schemas,
which xgrammar cannot stop once started, do not hold up another tenant's structured request."""

from __future__ import annotations

import json
import time

import pytest

from common.protocol import Constraint, ModelConfig
from tests.worker.engine.runs import request
from worker.decoding.grammar import GrammarCompiler, GrammarTimeout
from worker.decoding.grammar.fair_queue import FairQueue, TenantQueueFull
from worker.engine.engine import Engine
from worker.engine.prepare import RequestRejected


def heavy(index: int) -> Constraint:
    """Seconds of compile each on the SmolLM2 vocabulary (a long bounded string), distinct per index."""
    return Constraint("json_schema", json.dumps({"type": "string", "maxLength": 2500 + index}))


def light() -> Constraint:
    return Constraint("json_schema", json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                                                 "required": ["ok"], "title": f"light {time.time_ns()}"}))


@pytest.fixture(scope="module")
def engine(smol):
    """An engine (not started: only prepare runs) whose compiler lets a tenant keep one compile waiting."""
    engine = Engine(smol, ModelConfig(max_batch_size=2, max_context=512), "fairness")
    engine.grammars.close()
    engine.grammars = GrammarCompiler(engine.tokenizer, engine.vocab_size, engine.model_eos, threads=2,
                                      waiting_per_tenant=1)
    yield engine
    engine.grammars.close()


def _until(condition, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the compile threads never picked the job up"
        time.sleep(0.01)


def test_one_tenants_heavy_schemas_leave_a_thread_to_the_others(engine):
    compiler = engine.grammars
    with pytest.raises(GrammarTimeout):  # gives up waiting; the compile goes on (and lands in the cache)
        compiler.compile(heavy(0), timeout_s=0.01, tenant="team-a")
    _until(lambda: compiler.backlog("team-a") == (1, 0))
    with pytest.raises(GrammarTimeout):
        compiler.compile(heavy(1), timeout_s=0.01, tenant="team-a")
    assert compiler.backlog("team-a") == (1, 1)  # a tenant runs on all threads but one: this one waits

    with pytest.raises(RequestRejected) as refused:  # a third would wait too: retry later, through prepare
        engine.prepare(request("JSON:", max_tokens=8, constraint=heavy(2), tenant="team-a"))
    assert refused.value.kind == "overloaded" and refused.value.field == "response_format"

    prepared = engine.prepare(request("JSON:", max_tokens=8, constraint=light(), tenant="team-b"))
    assert prepared.grammar is not None
    assert not compiler.cached(heavy(0)) and not compiler.cached(heavy(1))  # team-b waited for none of them


def test_the_queue_serves_tenants_in_turn_within_their_caps():
    queue = FairQueue(per_tenant=1, waiting_per_tenant=2)
    for job in ("a1", "a2"):
        queue.put("a", job)
    with pytest.raises(TenantQueueFull):
        queue.put("a", "a3")
    queue.put("b", "b1")
    for job in ("x1", "x2", "x3"):  # a request that names no tenant is not capped
        queue.put("", job)
    assert queue.take() == ("a", "a1")
    assert queue.take() == ("b", "b1")
    assert [queue.take(), queue.take(), queue.take()] == [("", "x1"), ("", "x2"), ("", "x3")]
    assert queue.take() is None  # a2 waits: a already runs one
    assert queue.backlog("a") == (1, 1)
    queue.done("a")
    assert queue.take() == ("a", "a2") and queue.backlog("a") == (1, 0)
