"""A generation request is settled exactly once however it ends, at whatever stage: its body cut short, its task
cancelled while the worker is still silent or while a collected answer is gathered, its client gone mid-stream,
its time run out. Settled once: one ledger record with the outcome (and, mid-stream, the tokens relayed until
then), one count in `sluice_requests_total` (a second settlement would count twice), its concurrency slot free
for the key's next request, and its worker let go. Driven through the real gateway app with ASGI `receive` and
`send` the test controls, in front of a protocol worker (testkit/protocol_worker.py)."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest
import structlog
from structlog.testing import capture_logs

from gateway.metrics import REGISTRY
from testkit.protocol_worker import Reply, tokens
from tests.gateway.app_client import ADMIN_HEADERS, app_client, new_key
from tests.gateway.generation_bodies import body

PATH = "/v1/completions"
SILENT = Reply(tokens("one two three"), pause_s=60)  # a worker that says nothing for a minute
SLOW = Reply(tokens("one two three four five six seven eight nine ten"), pause_s=0.3)
# two tokens, then nothing until the test ends: past any request timeout, however the machine runs
HELD = Reply(tokens("one two three four five six seven eight nine ten"), hold_after=3)


def scope(headers: dict[str, str], raw: bytes) -> dict:
    pairs = [(k.encode(), v.encode()) for k, v in {**headers, "content-type": "application/json",
                                                   "content-length": str(len(raw))}.items()]
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": PATH, "raw_path": PATH.encode(), "query_string": b"", "headers": pairs,
            "client": ("127.0.0.1", 5000), "server": ("test", 80), "root_path": "", "state": {}}


class Call:
    """One request through the app's ASGI callable: what it was sent, and a client that leaves on `leave()`."""

    def __init__(self, gateway_app, headers: dict[str, str], payload: dict, *, cut_body: bool = False):
        raw = json.dumps(payload).encode()
        self.scope = scope(headers, raw)
        self.sent: list[dict] = []
        self._left = asyncio.Event()
        self._first = {"type": "http.request", "body": raw[:5], "more_body": True} if cut_body else \
            {"type": "http.request", "body": raw, "more_body": False}
        self._read = False
        if cut_body:  # the client leaves after the first bytes of its body
            self._left.set()
        self.task = asyncio.create_task(gateway_app.app(self.scope, self._receive, self._send))

    async def _receive(self) -> dict:
        if not self._read:
            self._read = True
            return self._first
        await self._left.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self._left.set()  # a server says a request whose response is complete is over: so does this one

    def leave(self) -> None:
        self._left.set()

    def chunks(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body" and m.get("body")]

    async def ended(self) -> None:
        """The end of the request, however it ended (a cancelled task raises CancelledError here: swallowed)."""
        await asyncio.wait({self.task}, timeout=30)
        assert self.task.done(), "the request did not end"

    @property
    def request_id(self) -> str:
        return self.scope["state"]["request_id"]


def settlements() -> float:
    """How many generation requests of PATH were settled so far, whatever their outcome."""
    return sum(sample.value for metric in REGISTRY.collect() if metric.name == "sluice_requests"
               for sample in metric.samples
               if sample.name == "sluice_requests_total" and sample.labels["route"] == PATH)


async def until(condition, what: str, timeout: float = 120.0) -> None:
    """Polls `condition`; the timeout only bounds a failing test."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"{what} did not happen"
        await asyncio.sleep(0.02)


async def record_of(gateway_app, request_id: str) -> dict:
    """The request's one ledger record (the ledger ships its local log to the database in the background)."""
    for _ in range(1200):  # a minute at most
        records = (await gateway_app.get("/admin/usage/records?limit=100", headers=ADMIN_HEADERS)).json()["data"]
        mine = [r for r in records if r["request_id"] == request_id]
        if mine:
            assert len(mine) == 1, mine
            return mine[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no ledger record of {request_id}")


async def assert_slot_free(gateway_app, headers: dict[str, str], worker) -> None:
    """The key (max_concurrency 1) can be served again: the request's slot was given back."""
    worker.replies = [Reply(tokens())]
    again = await gateway_app.post(PATH, json=body(PATH), headers=headers)
    assert again.status_code == 200, again.text


@pytest.fixture
async def key(gateway_app) -> dict[str, str]:
    return await new_key(gateway_app, limits={"max_concurrency": 1})


async def test_a_body_cut_short_is_settled_once_as_rejected(gateway_app, key):
    before = settlements()
    call = Call(gateway_app, key, body(PATH), cut_body=True)
    await call.ended()
    record = await record_of(gateway_app, call.request_id)
    assert record["status"] == "rejected" and record["error_code"] == "body_incomplete"
    assert record["finish_reason"] is None  # no answer began
    assert settlements() == before + 1


@pytest.mark.parametrize("stream", [False, True], ids=["collected", "stream"])
async def test_a_request_cancelled_before_its_first_token_is_settled_once(gateway_app, key, worker, stream):
    """The worker is silent: a stream's response has not begun (nothing listens for a disconnect), a collected
    answer is being gathered. The request's task is cancelled (a server that stops, say)."""
    worker.replies = [SILENT]
    before = settlements()
    call = Call(gateway_app, key, body(PATH, stream=stream, max_tokens=3))
    await until(lambda: worker.streaming == 1, "the worker's stream")
    call.task.cancel()
    await call.ended()
    assert call.task.cancelled() and not call.chunks()
    record = await record_of(gateway_app, call.request_id)
    assert record["status"] == "cancelled" and record["completion_tokens"] == 0
    assert record["finish_reason"] == "cancelled"
    assert settlements() == before + 1
    await until(lambda: worker.disconnected == [True], "the worker's release")
    await assert_slot_free(gateway_app, key, worker)


async def test_a_client_gone_mid_stream_is_settled_once_for_what_it_got(gateway_app, key, worker):
    worker.replies = [SLOW]
    before = settlements()
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        call = Call(gateway_app, key, body(PATH, stream=True, max_tokens=10))
        await until(lambda: len(call.chunks()) >= 2, "two chunks of the stream")
        call.leave()
        await call.ended()
    assert not call.task.cancelled() and b"[DONE]" not in b"".join(call.chunks())
    record = await record_of(gateway_app, call.request_id)
    assert record["status"] == "cancelled" and 1 <= record["completion_tokens"] < 10
    assert record["finish_reason"] == "cancelled"
    assert settlements() == before + 1
    # the access log, outside the request scope, wrote its one line after the settlement: with its outcome
    done = [line for line in logs if line["event"] == "request_done" and line["request_id"] == call.request_id]
    assert [line["status"] for line in done] == ["cancelled"]
    await until(lambda: worker.disconnected == [True], "the worker's release")
    await assert_slot_free(gateway_app, key, worker)


@pytest.mark.parametrize("stream", [False, True], ids=["collected", "stream"])
async def test_a_request_past_its_time_is_settled_once_as_an_error(gateway_settings, worker, stream):
    # long enough for the fast request that checks the slot afterwards, on a loaded machine too
    async with app_client(msgspec.structs.replace(gateway_settings, request_timeout_s=3.0)) as gateway_app:
        key = await new_key(gateway_app, limits={"max_concurrency": 1})
        worker.replies = [HELD]
        before = settlements()
        call = Call(gateway_app, key, body(PATH, stream=stream, max_tokens=10))
        await call.ended()
        sent = b"".join(call.chunks())
        assert b"request_timeout_s" in sent
        record = await record_of(gateway_app, call.request_id)
        assert record["status"] == "error" and record["error_code"] == "request_timeout"
        assert record["finish_reason"] == "timeout"
        assert settlements() == before + 1
        await until(lambda: worker.disconnected == [True], "the worker's release")
        await assert_slot_free(gateway_app, key, worker)
