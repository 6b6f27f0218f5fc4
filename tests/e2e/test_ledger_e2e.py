"""Issue 9 end to end: the usage ledger behind real `sluice serve` processes and one real worker.

1. Reconciliation: after a mixed load every request id has exactly one record, and the ledger bills
   exactly what each client was told (or, for a stream the client cut, what was generated and relayed).
2. SIGKILL of the gateway under load (SQLite and PostgreSQL): after a restart on the same data dir,
   every request whose client saw a complete response is billed exactly once.
3. PostgreSQL stops mid-run and comes back: every request that got a complete 200 is billed exactly once.
4. Finish reasons (SQLite and PostgreSQL): an answer that ends on EOS, one cut by max_tokens, a stream its client
   cancels and a tool call each leave a record that says so.
5. Cached prompt tokens (SQLite and PostgreSQL): the same long prompt twice; the second is a hit in the worker's
   prefix cache, and its record holds the cached tokens the client was told, priced at the cached-input price.
6. Predicted Outputs: a chat request whose `prediction` is its greedy answer after a few wrong words; its record
   holds the accepted and rejected prediction tokens the client was told, within the completion tokens billed.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from testkit.admin import admin, ledger_records
from testkit.corpora.tools import WEATHER
from testkit.databases import create_database
from testkit.servers import restarted_at_exit, take_down
from testkit.sluice import (
    MODEL,
    SluiceServer,
    standalone_worker,
    start_sluice,
)

pytestmark = pytest.mark.slow
ADMIN_KEY = "ledger-e2e-admin-key-0123456789abcdef"
PRICE_IN, PRICE_OUT = 150_000, 600_000  # micro-units per million tokens
BAD_TOKEN = 60_000  # outside SmolLM2's 49152-token vocabulary: the worker refuses it, not the gateway


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """One worker for every gateway of the module, so a SIGKILLed gateway leaves no orphan behind."""
    with standalone_worker(tmp_path_factory.mktemp("worker"), max_batch_size=32) as url:
        yield url


def start_gateway(data_dir: Path, worker: str, database_url: str | None = None, prices_extra: str = "") -> SluiceServer:
    data_dir.mkdir(parents=True, exist_ok=True)
    prices = data_dir / "prices.toml"
    prices.write_text(f'[pricing.models."{MODEL}"]\ninput = {PRICE_IN}\noutput = {PRICE_OUT}\n{prices_extra}')
    config = f'pricing_file = "{prices}"\n'
    config += "default_team_limits = {}\n"  # the load below hammers the default key: billing, not rate limits
    if database_url:
        config += f'database_url = "{database_url}"\n'
    config += f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{worker}"] }}\n'
    return start_sluice(data_dir, config=config, env={"SLUICE_ADMIN_KEY": ADMIN_KEY})


def cost(prompt: int, generated: int) -> int:
    return (prompt * PRICE_IN + generated * PRICE_OUT + 500_000) // 1_000_000


def wait_for_request_ids(server: SluiceServer, ids: set[str], timeout: float = 60.0, unnamed: int = 0) -> list[dict]:
    """The records are durable before a response ends; shipping to the database is asynchronous. `unnamed`:
    records of requests whose client hung up before it learnt their id; they end on the gateway's own time
    (a stream whose client is gone ends at its next write), so they are waited for too."""
    deadline = time.monotonic() + timeout
    while True:
        records = ledger_records(server)
        missing = ids - {r["request_id"] for r in records}
        if not missing and len(records) >= len(ids) + unnamed:
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(missing)} request ids never reached the ledger: {sorted(missing)[:5]}; "
                                 f"{len(records) - len(ids) + len(missing)} of {unnamed} unnamed records")
        time.sleep(0.2)


@dataclass
class Call:
    """What one client saw, and what it therefore expects the ledger to hold."""

    label: str
    route: str
    expect: str | None  # ledger status; None = no record (never authenticated)
    request_id: str | None = None
    http_status: int | None = None
    prompt: int | None = None  # exact prompt tokens, when the client knows them
    completion: int | None = None  # exact completion tokens, when the client knows them
    token_chunks: int = 0  # streamed chunks that carried a token
    max_tokens: int | None = None
    complete: bool = False  # a non-streamed 200 body, or a stream that reached [DONE]
    finished: bool = False  # a stream chunk carried finish_reason
    error: str | None = None  # error code from the body or the stream
    started: float = 0.0
    ended: float = 0.0


def auth(key: str) -> dict:
    return {"authorization": f"Bearer {key}"}


async def post(client: httpx.AsyncClient, call: Call, key: str, body: dict | None = None, *,
               raw: bytes | None = None) -> Call:
    call.started = time.monotonic()
    headers = {**auth(key), "content-type": "application/json"}
    response = await client.post(call.route, content=raw if raw is not None else json.dumps(body), headers=headers)
    call.ended = time.monotonic()
    call.request_id, call.http_status = response.headers.get("x-request-id"), response.status_code
    data = response.json()
    if response.status_code == 200:
        call.complete = True
        call.prompt, call.completion = data["usage"]["prompt_tokens"], data["usage"]["completion_tokens"]
    else:
        call.error = data["error"]["code"]
    return call


async def stream(client: httpx.AsyncClient, call: Call, key: str, body: dict, *, cut_after: int | None = None,
                 cut_at_finish: bool = False) -> Call:
    """Read an SSE stream; `cut_after` closes the connection after that many token chunks,
    `cut_at_finish` right after the chunk with finish_reason (before the usage chunk and [DONE])."""
    call.started = time.monotonic()
    call.max_tokens = body.get("max_tokens")
    async with client.stream("POST", call.route, json={**body, "stream": True}, headers=auth(key)) as response:
        call.request_id, call.http_status = response.headers.get("x-request-id"), response.status_code
        if response.status_code != 200:
            call.error = json.loads(await response.aread())["error"]["code"]
            call.ended = time.monotonic()
            return call
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                call.complete = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                call.error = chunk["error"]["code"]
                continue
            if chunk.get("usage"):
                call.prompt, call.completion = chunk["usage"]["prompt_tokens"], chunk["usage"]["completion_tokens"]
            for choice in chunk["choices"]:
                if "token" in choice or (choice.get("delta", {}).get("content") and "role" not in choice["delta"]):
                    call.token_chunks += 1
                if choice.get("finish_reason"):
                    call.finished = True
            if cut_after is not None and call.token_chunks >= cut_after:
                break  # leaving the `async with` early closes the connection mid-stream
            if cut_at_finish and call.finished:
                break
    call.ended = time.monotonic()
    return call


def abandon(server: SluiceServer, key: str, count: int) -> None:
    """Streamed chat requests whose client hangs up right after sending: the gateway authenticated
    them, then lost the client while reading the body. Each must still get its one record."""
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps(chat_body(max_tokens=50, stream=True)).encode()
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    for _ in range(count):
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(head + body)


def check_priced(record: dict) -> None:
    prices = (PRICE_IN, PRICE_OUT) if record["model"] == MODEL else (0, 0)  # an unpriced model costs nothing
    assert (record["input_price_micros"], record["output_price_micros"]) == prices, record
    generated = max(record["compute_tokens"], record["completion_tokens"])
    assert record["cost_micros"] == cost(record["prompt_tokens"], generated), record


# ---------------------------------------------------------------- 1. reconciliation


COMPLETION = "/v1/completions"
CHAT = "/v1/chat/completions"
PROMPTS = ["The capital of France is", "Rivers flow toward", "Once upon a time"]
MESSAGES = [{"role": "user", "content": "Name three colours."}]


def completion_body(prompt=PROMPTS[0], max_tokens: int = 8, **extra) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}


def chat_body(max_tokens: int = 8, **extra) -> dict:
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, **extra}


USAGE = {"stream_options": {"include_usage": True}}
LONG = {"ignore_eos": True}  # exactly max_tokens tokens: a long stream stays open until the client cuts it


async def test_mixed_load_reconciles_exactly_with_the_ledger(worker, tmp_path):
    server = start_gateway(tmp_path / "gateway", worker)
    try:
        await _reconcile(server)
    finally:
        server.stop()


async def _reconcile(server: SluiceServer) -> None:
    key = server.api_key
    team = admin(server, "POST", "/admin/teams", name="rpm-team", limits={"rpm": 3})
    limited_key = admin(server, "POST", "/admin/keys", name="rpm-key", team_id=team["id"])["key"]
    calls: list[Call] = []
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        # baselines: the exact prompt token counts a cut stream cannot report
        baseline_completion = await post(client, Call("baseline completion", COMPLETION, "ok"), key,
                                         completion_body(max_tokens=2))
        baseline_chat = await post(client, Call("baseline chat", CHAT, "ok"), key, chat_body(max_tokens=2))
        calls += [baseline_completion, baseline_chat]
        prompt_of = {COMPLETION: baseline_completion.prompt, CHAT: baseline_chat.prompt}

        async def rate_limited() -> list[Call]:
            done = []
            for i in range(6):
                done.append(await post(client, Call(f"rpm {i}", COMPLETION, "ok"), limited_key,
                                       completion_body(max_tokens=2)))
            return done

        work = [
            *(post(client, Call("completion", COMPLETION, "ok"), key, completion_body(p)) for p in PROMPTS),
            post(client, Call("completion n=2", COMPLETION, "ok"), key,
                 completion_body(max_tokens=6, n=2, temperature=0.8, seed=7)),
            post(client, Call("completion two prompts", COMPLETION, "ok"), key, completion_body(PROMPTS[:2])),
            post(client, Call("chat", CHAT, "ok"), key, chat_body()),
            post(client, Call("chat n=2", CHAT, "ok"), key, chat_body(max_tokens=5, n=2, temperature=0.8)),
            *(stream(client, Call("stream completion", COMPLETION, "ok"), key, completion_body(p, **USAGE))
              for p in PROMPTS[:2]),
            stream(client, Call("stream completion n=2", COMPLETION, "ok"), key,
                   completion_body(max_tokens=5, n=2, temperature=0.8, **USAGE)),
            stream(client, Call("stream chat", CHAT, "ok"), key, chat_body(**USAGE)),
            stream(client, Call("stream chat n=2", CHAT, "ok"), key, chat_body(n=2, temperature=0.8, **USAGE)),
            *(stream(client, Call("cut completion", COMPLETION, "cancelled"), key,
                     completion_body(max_tokens=200, **LONG, **USAGE), cut_after=3) for _ in range(2)),
            stream(client, Call("cut chat", CHAT, "cancelled"), key, chat_body(max_tokens=200, **LONG, **USAGE),
                   cut_after=3),
            *(stream(client, Call("cut at finish", COMPLETION, "ok|cancelled"), key,
                     completion_body(max_tokens=6, **LONG, **USAGE), cut_at_finish=True) for _ in range(2)),
            post(client, Call("worker refuses", COMPLETION, "rejected"), key, completion_body([BAD_TOKEN])),
            stream(client, Call("worker refuses stream", COMPLETION, "rejected"), key, completion_body([BAD_TOKEN])),
            post(client, Call("invalid temperature", COMPLETION, "rejected"), key,
                 completion_body(temperature=5)),
            post(client, Call("invalid chat body", CHAT, "rejected"), key, {"model": MODEL, "max_tokens": 3}),
            post(client, Call("invalid json", CHAT, "rejected"), key, raw=b'{"model": '),
            post(client, Call("unknown model", COMPLETION, "rejected"), key, {**completion_body(), "model": "nope"}),
            post(client, Call("bad key", COMPLETION, None), "sk-sluice-000000000000-nope", completion_body()),
        ]
        results = await asyncio.gather(rate_limited(), *work)
    calls += results[0] + list(results[1:])
    abandoned = 5
    await asyncio.to_thread(abandon, server, key, abandoned)
    await asyncio.to_thread(_verify, server, key, team, calls, prompt_of, abandoned)


def _verify(server: SluiceServer, key: str, team: dict, calls: list[Call], prompt_of: dict[str, int],
            abandoned: int) -> None:
    limited = [c for c in calls if c.label.startswith("rpm")]
    assert {c.http_status for c in limited} == {200, 429}, [c.http_status for c in limited]
    for c in limited:
        c.expect = "ok" if c.http_status == 200 else "rejected"
    for c in calls:
        assert c.request_id, c
        assert c.http_status != 500, c
        if c.expect in ("ok", "cancelled") and c.label != "cut at finish":
            assert c.http_status == 200, c
        if c.expect == "ok":
            assert c.complete and c.completion is not None, c
        if c.label.startswith("stream ") and c.expect == "ok":
            assert c.token_chunks <= c.completion, c  # chat holds back incomplete UTF-8 pieces
            if c.route == COMPLETION:
                assert c.token_chunks == c.completion, c
        if c.expect == "cancelled":
            assert not c.complete and c.token_chunks == 3, c
    assert [c.http_status for c in calls if c.label.startswith(("invalid temperature", "invalid chat"))] == [400, 400]
    assert next(c for c in calls if c.label == "invalid json").http_status == 400
    assert next(c for c in calls if c.label == "unknown model").http_status == 404
    assert next(c for c in calls if c.label == "bad key").http_status == 401
    refused = next(c for c in calls if c.label == "worker refuses")
    assert refused.http_status == 400 and refused.error == "invalid_value", refused
    refused_stream = next(c for c in calls if c.label == "worker refuses stream")
    # refused before its first token, a stream gets the real status too (headers wait for the first event)
    assert refused_stream.http_status == 400 and refused_stream.error == "invalid_value", refused_stream

    billed = [c for c in calls if c.expect is not None]
    records = wait_for_request_ids(server, {c.request_id for c in billed}, unnamed=abandoned)
    ids = [r["request_id"] for r in records]
    assert len(ids) == len(set(ids)), "a request id was recorded twice"
    # the abandoned requests never saw their id: they are the only records no client can name
    unnamed = [r for r in records if r["request_id"] not in {c.request_id for c in billed}]
    assert len(unnamed) == abandoned, unnamed
    for r in unnamed:  # usually lost while the body was read (a refusal: body_incomplete); later, a cut stream
        assert r["route"] == CHAT and r["status"] in ("rejected", "error", "cancelled"), r
        if r["status"] == "rejected":
            assert (r["prompt_tokens"], r["completion_tokens"], r["cost_micros"]) == (0, 0, 0), r
            assert (r["error_status"], r["error_code"]) == (408, "body_incomplete"), r
        if r["status"] == "error":
            assert (r["prompt_tokens"], r["completion_tokens"], r["cost_micros"]) == (0, 0, 0), r
            assert (r["error_status"], r["error_code"]) == (500, "internal_error"), r  # no error to name
        check_priced(r)
    by_id = {r["request_id"]: r for r in records}
    named = {c.request_id for c in billed}
    done_logs = [e["request_id"] for e in server.log_events_once(
        "request_done", lambda found: named <= {e["request_id"] for e in found})]
    for c in calls:
        if c.expect is None:
            assert c.request_id not in by_id
            continue
        assert done_logs.count(c.request_id) == 1, c  # accounting finished exactly once
        r = by_id[c.request_id]
        check_priced(r)
        assert r["route"] == c.route, (c, r)
        assert r["team_id"] == team["id"] if c.label.startswith("rpm") else r["team_id"] != team["id"]
        if c.expect in ("error", "rejected"):
            assert r["status"] == c.expect, (c, r)
            assert (r["prompt_tokens"], r["completion_tokens"], r["compute_tokens"], r["cost_micros"]) == (0, 0, 0, 0)
            assert (r["error_status"], r["error_code"]) == (c.http_status, c.error), (c, r)  # what the client got
            continue
        assert (r["error_status"], r["error_code"]) == (None, None), r
        assert r["model"] == MODEL, r
        assert r["compute_tokens"] == r["completion_tokens"], r  # no beams, no best_of in this load
        if c.expect == "ok":
            assert r["status"] == "ok" and r["worker_id"], (c, r)
            assert (r["prompt_tokens"], r["completion_tokens"]) == (c.prompt, c.completion), (c, r)
        elif c.expect == "cancelled":
            # the client read 3 tokens; the worker went on until the gateway saw the disconnect: it is
            # billed what it generated and the gateway relayed, which is at least 3 and stopped well
            # short of max_tokens (the cut reached the worker)
            assert r["status"] == "cancelled" and r["worker_id"], (c, r)  # known from Accepted
            assert r["prompt_tokens"] == prompt_of[c.route], (c, r)
            assert c.token_chunks <= r["completion_tokens"] < c.max_tokens, (c, r)
        else:  # cut right after the last token: whichever side won, every generated token is billed
            assert c.finished and c.token_chunks == 6, c
            assert r["status"] in ("ok", "cancelled"), r
            assert (r["prompt_tokens"], r["completion_tokens"]) == (prompt_of[c.route], 6), (c, r)

    # the client-side sums (each cut stream's own record stands in for what its client could not see)
    def tokens(c: Call) -> tuple[int, int]:
        r = by_id[c.request_id]
        if c.expect in ("error", "rejected"):
            return 0, 0
        if c.expect == "ok":
            return c.prompt, c.completion
        return r["prompt_tokens"], r["completion_tokens"]

    prompt_sum = sum(tokens(c)[0] for c in billed)
    completion_sum = sum(tokens(c)[1] for c in billed)
    cost_sum = sum(cost(*tokens(c)) for c in billed)
    totals = admin(server, "GET", "/admin/usage?group_by=none")["totals"]
    prompt_sum += sum(r["prompt_tokens"] for r in unnamed)
    completion_sum += sum(r["completion_tokens"] for r in unnamed)
    cost_sum += sum(r["cost_micros"] for r in unnamed)
    assert (totals["requests"], totals["prompt_tokens"], totals["completion_tokens"], totals["compute_tokens"],
            totals["cost_micros"]) == (len(billed) + abandoned, prompt_sum, completion_sum, completion_sum, cost_sum)
    statuses = [by_id[c.request_id]["status"] for c in billed]
    assert {"ok", "cancelled", "rejected"} <= set(statuses)  # "error": the abandoned requests above

    # the raw-records endpoint is admin-only and validates its window
    denied = httpx.get(f"{server.url}/admin/usage/records", headers=auth(key))
    assert denied.status_code == 403 and denied.json()["error"]["type"] == "permission_error"
    bad = httpx.get(f"{server.url}/admin/usage/records?start=yesterday", headers=auth(ADMIN_KEY))
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "start"
    window = httpx.get(f"{server.url}/admin/usage/records?start=2000-01-01&end=2000-01-02", headers=auth(ADMIN_KEY))
    assert window.status_code == 200 and window.json()["data"] == []


# ---------------------------------------------------------------- load shared by 2. and 3.


async def load(server: SluiceServer, key: str, calls: list[Call], stop: asyncio.Event, *, tasks: int = 8,
               max_tokens: int = 12, probes: int = 0) -> None:
    """Concurrent clients alternating non-streamed and streamed completions until `stop`; `probes`
    more clients send one-token requests back to back (new requests arrive all the time)."""

    async def client_loop(index: int) -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            turn = index
            while not stop.is_set():
                turn += 1
                call = Call(f"load {index}", COMPLETION, "ok")
                calls.append(call)
                length = 1 if index >= tasks else max_tokens
                body = completion_body(PROMPTS[turn % len(PROMPTS)], max_tokens=length, **LONG)
                try:
                    if turn % 2:
                        await post(client, call, key, body)
                    else:
                        await stream(client, call, key, {**body, **USAGE})
                except (httpx.HTTPError, json.JSONDecodeError, KeyError) as exc:
                    call.error = type(exc).__name__
                    call.complete = False
                    await asyncio.sleep(0.05)  # the gateway is gone: do not spin

    await asyncio.gather(*(client_loop(i) for i in range(tasks + probes)))


def check_complete_billed_once(calls: list[Call], records: list[dict]) -> None:
    ids = [r["request_id"] for r in records]
    assert len(ids) == len(set(ids)), "a request id was recorded twice"
    by_id = {r["request_id"]: r for r in records}
    complete = [c for c in calls if c.complete]
    for c in complete:
        r = by_id[c.request_id]
        assert r["status"] == "ok", (c, r)
        assert (r["prompt_tokens"], r["completion_tokens"]) == (c.prompt, c.completion), (c, r)
        check_priced(r)
    assert len(records) <= len(calls)  # nothing recorded that no client sent


# ---------------------------------------------------------------- 2. SIGKILL of the gateway


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_sigkill_under_load_bills_every_completed_request_exactly_once(backend, request, worker, tmp_path):
    database_url = await create_database(request.getfixturevalue("postgres").url) if backend == "postgres" else None
    data_dir = tmp_path / "gateway"
    server = start_gateway(data_dir, worker, database_url)
    key = server.api_key  # printed once, at bootstrap; the restarted gateway keeps it in the database
    calls: list[Call] = []
    stop = asyncio.Event()
    runner = asyncio.create_task(load(server, key, calls, stop))
    try:
        while sum(c.complete for c in calls) < 20:
            await asyncio.sleep(0.1)
            assert not runner.done(), runner
        in_flight = [c for c in calls if not c.ended]
        await asyncio.to_thread(server.stop, signal.SIGKILL)
        assert server.process.returncode == -signal.SIGKILL
    finally:
        stop.set()
        await runner
    assert in_flight, "nothing was in flight at the kill"
    assert any(not c.complete for c in calls)

    restarted = start_gateway(data_dir, worker, database_url)
    try:
        complete = {c.request_id for c in calls if c.complete}
        records = await asyncio.to_thread(wait_for_request_ids, restarted, complete)
        check_complete_billed_once(calls, records)
        # after the restart the ledger goes on with new requests, and the old ones stay single
        async with httpx.AsyncClient(base_url=restarted.url, timeout=60) as client:
            after = await post(client, Call("after restart", COMPLETION, "ok"), key, completion_body(max_tokens=2))
        assert after.complete
        records = await asyncio.to_thread(wait_for_request_ids, restarted, complete | {after.request_id})
        check_complete_billed_once([*calls, after], records)
    finally:
        restarted.stop()


# ---------------------------------------------------------------- 3. PostgreSQL goes down mid-run


async def test_postgres_outage_mid_run_bills_every_completed_request_exactly_once(postgres, worker, tmp_path):
    """While PostgreSQL is down, the key is answered from its last known record (auth's outage_grace), so
    completions keep being served; their records wait in the local WAL until the database is back and then
    land exactly once. A 503 is allowed only as `auth_unavailable` (a lookup never seen before)."""
    server = start_gateway(tmp_path / "gateway", worker, await create_database(postgres.url))
    try:  # a failure anywhere below must not leave the gateway running
        key = server.api_key
        calls: list[Call] = []
        stop = asyncio.Event()
        with restarted_at_exit(postgres):
            runner = asyncio.create_task(load(server, key, calls, stop, max_tokens=16, probes=2))
            try:
                while sum(c.complete for c in calls) < 10:
                    await asyncio.sleep(0.1)
                    assert not runner.done(), runner
                down_at = time.monotonic()
                await asyncio.to_thread(take_down, postgres)
                # stay down until requests that started during the outage completed (the WAL path)
                while sum(c.complete and c.started > down_at + 0.5 for c in calls) < 10:
                    await asyncio.sleep(0.1)
                    assert time.monotonic() - down_at < 180, "no request completed while PostgreSQL was down"
                up_at = time.monotonic()
                await asyncio.to_thread(postgres.start)
                back_at = time.monotonic()
                while sum(c.complete and c.started > back_at for c in calls) < 10:  # service resumes
                    await asyncio.sleep(0.1)
                    assert time.monotonic() - back_at < 180, "no request succeeded after PostgreSQL came back"
            finally:
                stop.set()
                await runner

        timeline = [(round(c.started - down_at, 2), round(c.ended - down_at, 2), c.http_status, c.error)
                    for c in calls if c.ended > down_at - 1]
        statuses = {c.http_status for c in calls}
        assert statuses <= {200, 503}, timeline
        unavailable = [c for c in calls if c.http_status == 503]
        assert {c.error for c in unavailable} <= {"auth_unavailable"}, timeline
        assert all(c.complete for c in calls if c.http_status == 200)
        # responses that completed while the database was down: their records went through the WAL
        assert any(down_at + 0.5 < c.ended < up_at for c in calls if c.complete), timeline
        complete = {c.request_id for c in calls if c.complete}
        records = await asyncio.to_thread(wait_for_request_ids, server, complete, 90.0)
        check_complete_billed_once(calls, records)
        billed = {r["request_id"] for r in records}
        assert not billed & {c.request_id for c in unavailable}
        assert billed == complete  # every record is a request a client saw complete
    finally:
        server.stop()


# ---------------------------------------------------------------- 4. why each answer ended


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_each_record_says_why_its_answer_ended(backend, request, worker, tmp_path):
    database_url = await create_database(request.getfixturevalue("postgres").url) if backend == "postgres" else None
    server = start_gateway(tmp_path / "gateway", worker, database_url)
    try:
        key = server.api_key
        tools = [{"type": "function", "function": {"name": WEATHER.name, "description": WEATHER.description,
                                                    "parameters": WEATHER.parameters}}]
        named = {"type": "function", "function": {"name": WEATHER.name}}
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            calls = [
                # token 1000 named an end-of-sequence token for this request and biased to the top: it comes first
                await post(client, Call("eos", COMPLETION, "ok"), key,
                           completion_body(max_tokens=16, eos_token=[1000], logit_bias={"1000": 100})),
                await post(client, Call("max_tokens", COMPLETION, "ok"), key, completion_body(max_tokens=3, **LONG)),
                await stream(client, Call("cancelled", CHAT, "cancelled"), key, chat_body(max_tokens=200, **LONG),
                             cut_after=2),
                await post(client, Call("tool call", CHAT, "ok"), key, chat_body(
                    max_tokens=128, messages=[{"role": "user", "content": "What's the weather like in Paris?"}],
                    tools=tools, tool_choice=named, parallel_tool_calls=False,
                    tool_prompt="You can call these tools:\n")),
            ]
        assert [c.http_status for c in calls] == [200] * 4, calls
        assert calls[1].completion == 3 and calls[2].token_chunks == 2 and not calls[2].complete
        records = {r["request_id"]: r for r in
                   await asyncio.to_thread(wait_for_request_ids, server, {c.request_id for c in calls})}
        assert {c.label: (records[c.request_id]["status"], records[c.request_id]["finish_reason"]) for c in calls} == {
            "eos": ("ok", "stop"), "max_tokens": ("ok", "length"), "cancelled": ("cancelled", "cancelled"),
            "tool call": ("ok", "tool_calls")}
    finally:
        server.stop()


# ---------------------------------------------------------------- 5. cached prompt tokens

PRICE_CACHED = 30_000  # micro-units per million prompt tokens the prefix cache supplied
SHARED_PROMPT = " ".join(f"Rule {i}: answer briefly and politely." for i in range(30))  # ~ 250 tokens


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_prefix_cache_hit_is_recorded_and_priced_at_the_cached_price(backend, request, worker, tmp_path):
    database_url = await create_database(request.getfixturevalue("postgres").url) if backend == "postgres" else None
    server = start_gateway(tmp_path / "gateway", worker, database_url, prices_extra=f"cached_input = {PRICE_CACHED}\n")
    try:
        answers = []
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            body = completion_body(f"[{backend}] {SHARED_PROMPT}", max_tokens=2)
            for _ in range(2):  # one after the other: the first fills the cache the second reads
                response = await client.post(COMPLETION, json=body, headers=auth(server.api_key))
                assert response.status_code == 200, response.text
                answers.append(response)
        told = [a.json()["usage"] for a in answers]
        ids = [a.headers["x-request-id"] for a in answers]
        records = {r["request_id"]: r for r in await asyncio.to_thread(wait_for_request_ids, server, set(ids))}
        first, second = (records[i] for i in ids)
        assert told[0]["prompt_tokens_details"]["cached_tokens"] == first["cached_tokens"] == 0
        cached = second["cached_tokens"]
        assert cached == told[1]["prompt_tokens_details"]["cached_tokens"] and 0 < cached <= second["prompt_tokens"]
        assert cached >= second["prompt_tokens"] - 32  # every whole block of the prompt but its last
        output = max(second["compute_tokens"], second["completion_tokens"])
        exact = (second["prompt_tokens"] - cached) * PRICE_IN + cached * PRICE_CACHED + output * PRICE_OUT
        assert second["cost_micros"] == (exact + 500_000) // 1_000_000
        assert second["cache_saved_micros"] == cost(second["prompt_tokens"], output) - second["cost_micros"] > 0
        assert first["cost_micros"] == cost(first["prompt_tokens"], max(first["compute_tokens"],
                                                                         first["completion_tokens"]))
    finally:
        server.stop()


# ---------------------------------------------------------------- 6. predicted outputs


async def test_a_predicted_request_records_the_prediction_tokens_it_was_told(worker, tmp_path):
    server = start_gateway(tmp_path / "gateway", worker)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            plain = await client.post(CHAT, json=chat_body(max_tokens=16), headers=auth(server.api_key))
            assert plain.status_code == 200, plain.text
            text = plain.json()["choices"][0]["message"]["content"]
            # words it will not say, then the answer: the first refused, the answer then found again and accepted
            prediction = "Zebra quartz violin. " + text
            predicted = await client.post(CHAT, headers=auth(server.api_key), json=chat_body(
                max_tokens=16, prediction={"type": "content", "content": prediction}))
            assert predicted.status_code == 200, predicted.text
        told = predicted.json()["usage"]
        request_id = predicted.headers["x-request-id"]
        record = next(r for r in await asyncio.to_thread(wait_for_request_ids, server, {request_id})
                      if r["request_id"] == request_id)
        details = told["completion_tokens_details"]
        assert details["accepted_prediction_tokens"] > 0 and details["rejected_prediction_tokens"] > 0, told
        assert (record["accepted_prediction_tokens"], record["rejected_prediction_tokens"],
                record["completion_tokens"]) == (details["accepted_prediction_tokens"],
                                                 details["rejected_prediction_tokens"], told["completion_tokens"])
        predicted_tokens = record["accepted_prediction_tokens"] + record["rejected_prediction_tokens"]
        assert predicted_tokens <= record["completion_tokens"]
        assert record["cost_micros"] == cost(record["prompt_tokens"], max(record["compute_tokens"],
                                                                          record["completion_tokens"]))
    finally:
        server.stop()
