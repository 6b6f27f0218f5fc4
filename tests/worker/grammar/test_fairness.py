"""Grammar compiles are shared fairly among tenants (fair_queue.py): one tenant's heavy distinct schemas,
which xgrammar cannot stop once started, do not hold up another tenant's structured request, nor, waited for
on the event loop (worker/server.py), the threads other requests are prepared on; and each tenant has its own
cache of compiled grammars, so no timing tells one team another's schemas."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import msgspec
import pytest

from common.protocol import Constraint, ModelConfig, ModelInfo
from tests.worker.engine.runs import request, running_engine
from tests.worker.grammar.helpers import HANG_GUARD_S, compiles_held
from worker.decoding.grammar import GrammarCompiler, GrammarTimeout
from worker.decoding.grammar.fair_queue import FairQueue, TenantQueueFull
from worker.engine.engine import Engine
from worker.engine.prepare import RequestRejected
from worker.server import create_worker_app


def heavy(index: int) -> Constraint:
    """A schema distinct per index. Its compile is as slow as the test needs: the tests hold it (its process
    stopped) rather than count on a schema that usually takes long, which a loaded machine makes unpredictable."""
    return Constraint("json_schema", json.dumps({"type": "object", "properties": {"slow": {"type": "integer"}},
                                                 "title": f"heavy {index}"}))


def light() -> Constraint:
    return Constraint("json_schema", json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                                                 "required": ["ok"], "title": f"light {time.time_ns()}"}))


@pytest.fixture(scope="module")
def engine(smol):
    """An engine (not started: only prepare runs)."""
    engine = Engine(smol, ModelConfig(max_batch_size=2, max_context=512), "fairness")
    engine.grammars.close()
    yield engine


@pytest.fixture
def compiler(engine):
    """The engine's compiler, fresh per test: a tenant may keep one compile waiting; no time limit can trip."""
    engine.grammars = GrammarCompiler(engine.tokenizer, engine.vocab_size, engine.model_eos, threads=2,
                                      waiting_per_tenant=1, timeout_s=HANG_GUARD_S)
    yield engine.grammars
    engine.grammars.close()


def _until(condition, seconds: float = HANG_GUARD_S) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the compile threads never picked the job up"
        time.sleep(0.01)


def test_one_tenants_heavy_schemas_leave_a_thread_to_the_others(engine, compiler):
    with compiles_held(compiler):
        with pytest.raises(GrammarTimeout):  # gives up waiting; the compile goes on (held: it cannot finish)
            compiler.compile(heavy(0), timeout_s=0.01, tenant="team-a")
        _until(lambda: compiler.backlog("team-a") == (1, 0) and any(p.compiling for p in compiler._processes))
        for process in compiler._processes:  # the process with team-a's compile stays stopped; the others serve
            if not process.compiling:
                os.kill(process.pid, signal.SIGCONT)
        with pytest.raises(GrammarTimeout):
            compiler.compile(heavy(1), timeout_s=0.01, tenant="team-a")
        assert compiler.backlog("team-a") == (1, 1)  # a tenant runs on all threads but one: this one waits

        with pytest.raises(RequestRejected) as refused:  # a third would wait too: retry later, through prepare
            engine.prepare(request("JSON:", max_tokens=8, constraint=heavy(2), tenant="team-a"))
        assert refused.value.kind == "overloaded" and refused.value.field == "response_format"

        prepared = engine.prepare(request("JSON:", max_tokens=8, constraint=light(), tenant="team-b"))
        assert prepared.grammar is not None
        assert not compiler.cached(heavy(0)) and not compiler.cached(heavy(1))  # team-b waited for neither


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


def test_each_tenant_compiles_and_caches_its_own_grammars(compiler):
    """A cached schema answers in milliseconds, a new one in seconds: shared across tenants, the cache told
    any team whether another had sent a schema. Each team now compiles its own."""
    constraint = light()
    first = compiler.compile(constraint, timeout_s=HANG_GUARD_S, tenant="team-c")
    theirs = compiler.compile(constraint, timeout_s=HANG_GUARD_S, tenant="team-d")
    assert theirs is not first and theirs.key != first.key  # compiled again, not team-c's from the cache
    assert compiler.cached(constraint, tenant="team-c") and not compiler.cached(constraint, tenant="team-e")
    assert compiler.compile(constraint, timeout_s=HANG_GUARD_S, tenant="team-c") is first  # its own cache serves it


async def test_compiles_in_progress_hold_no_thread_another_tenants_request_is_prepared_at_once(smol):
    """Two teams' compiles that cannot finish (their processes stopped) and as many prepare threads as
    compiles: before, each compile's request held a prepare thread while it waited, and a third team's plain
    request waited for one of them to end. Now the compile is awaited on the event loop."""
    with running_engine(smol, "grammar-threads", max_batch_size=2, max_context=256) as engine:
        engine.grammars.close()
        compiler = engine.grammars = GrammarCompiler(engine.tokenizer, engine.vocab_size, engine.model_eos,
                                                     threads=2, timeout_s=HANG_GUARD_S)
        warm = [threading.Thread(target=compiler.compile, args=(light(),),
                                 kwargs={"tenant": t, "timeout_s": HANG_GUARD_S})
                for t in ("warm-1", "warm-2")]  # one compile on each process: both started and answering
        for thread in warm:
            thread.start()
        for thread in warm:
            thread.join()
        pids = [process._process.pid for process in compiler._processes]
        assert len(pids) == 2
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2))  # as many threads as compiles
        app = create_worker_app(engine, ModelInfo(model_id="smol", model_dtype="float32", device="cpu",
                                                  quantization="none", max_context=256, max_rows=2,
                                                  vocab_size=engine.vocab_size, eos_token_ids=engine.model_eos))
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            # httpx's ASGI transport runs the app on this loop (Litestar's test client runs it on a thread of its own)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://worker") as client:
                compiling = [asyncio.create_task(client.post("/generate", content=generate_body(
                    "JSON:", max_tokens=4, constraint=heavy(10 + i), tenant=tenant)))
                    for i, tenant in enumerate(("team-a", "team-b"))]
                while compiler.backlog("team-a")[0] + compiler.backlog("team-b")[0] < 2:
                    assert not any(task.done() for task in compiling), [task.result().text for task in compiling
                                                                        if task.done()]
                    await asyncio.sleep(0.01)  # both compiles taken by the stopped processes
                plain = await asyncio.wait_for(client.post("/generate", content=generate_body(
                    "Hi", max_tokens=1, tenant="team-c")), HANG_GUARD_S)
                assert plain.status_code == 200, plain.text
                assert not any(task.done() for task in compiling)  # answered while both compiles wait
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
                pids = []
                for answer in await asyncio.wait_for(asyncio.gather(*compiling), HANG_GUARD_S):
                    assert answer.status_code == 200, answer.text
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)


def generate_body(prompt: str, **params) -> bytes:
    return msgspec.json.encode(request(prompt, **params))
