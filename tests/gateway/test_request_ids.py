"""A caller's `X-Request-Id` is honoured when it is safe (echoed, logged as `client_request_id`), replaced by our
own id when it is not, and never becomes the ledger's key: the same id sent twice is still two records."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
import structlog
from structlog.testing import capture_logs

from gateway.serving.request_scope import new_request_id
from testkit.protocol_worker import MODEL
from tests.gateway.generation_bodies import body
from tests.gateway.test_request_scope import record_of

OURS = re.compile(r"[0-9a-f]{32}")


@pytest.mark.parametrize("given", ["req-7f3a", "5f0c1e6a-8b7d-4c1e-9a2b-0d3e4f5a6b7c", "Root=1-abc/x+y:z.1_2",
                                   "a" * 128])
async def test_a_valid_request_id_is_echoed_and_logged(gateway_app, given):
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        response = await gateway_app.post("/v1/completions", json=body("/v1/completions"),
                                      headers={**gateway_app.key_headers, "x-request-id": given})
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == given
    ours = response.json()["id"].removeprefix("cmpl-")
    assert OURS.fullmatch(ours)  # the reply's own id stays ours
    done = [line for line in logs if line["event"] == "request_done"]
    assert done and done[0]["client_request_id"] == given and done[0]["request_id"] == ours


@pytest.mark.parametrize("given", ["a" * 129, "has space", 'quote"d', "semi;colon", "-leading-dash", "é-accent",
                                   "new\\nline", ""])
async def test_an_unsafe_request_id_is_replaced_by_ours(gateway_app, given):
    response = await gateway_app.post("/v1/completions", json=body("/v1/completions"),
                                  headers={**gateway_app.key_headers, "x-request-id": given.encode("utf-8")})
    assert response.status_code == 200, response.text
    assert OURS.fullmatch(response.headers["x-request-id"])


async def test_no_request_id_gets_ours(gateway_app):
    before = time.time_ns() // 1_000_000
    response = await gateway_app.get("/v1/models", headers=gateway_app.key_headers)
    after = time.time_ns() // 1_000_000
    ours = response.headers["x-request-id"]
    assert OURS.fullmatch(ours)
    assert before <= int(ours[:12], 16) <= after  # it starts with when it was made


def test_our_ids_sort_by_time_and_never_repeat():
    """The ledger's unique index on them appends instead of landing each record on a random page."""
    ids = []
    for _ in range(3):
        ids += [new_request_id() for _ in range(20_000)]
        time.sleep(0.002)
    assert len(set(ids)) == len(ids)
    assert all(OURS.fullmatch(i) for i in ids)
    millis = [int(i[:12], 16) for i in ids]
    assert millis == sorted(millis) and millis[-1] > millis[0]
    assert len({i[12:] for i in ids}) == len(ids)  # the random part alone is unique too


async def test_the_same_request_id_twice_is_two_ledger_records(gateway_app, worker):
    headers = {**gateway_app.key_headers, "x-request-id": "reused-id"}
    for _ in range(2):
        assert (await gateway_app.post("/generate", json=body("/generate"), headers=headers)).status_code == 200
    shipped = []
    for _ in range(1200):  # the ledger ships its local log to the database in the background
        records = (await gateway_app.get("/admin/usage/records", headers=gateway_app.admin_headers)).json()["data"]
        shipped = [r for r in records if r["route"] == "/generate"]
        if len(shipped) >= 2:
            break
        await asyncio.sleep(0.05)
    assert len(shipped) == 2 and shipped[0]["request_id"] != shipped[1]["request_id"]
    assert len(worker.requests) == 2 and worker.requests[0]["request_id"] != worker.requests[1]["request_id"]


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer sk-sluice-not-a-key"}])
async def test_a_refused_request_still_answers_its_id(gateway_app, headers):
    """The authentication middleware refuses before any route runs: its 401 carries the id too (support
    asks for it first)."""
    response = await gateway_app.post("/v1/completions", json=body("/v1/completions"),
                                  headers={**headers, "x-request-id": "refused-1"})
    assert response.status_code == 401, response.text
    assert response.headers["x-request-id"] == "refused-1"


async def test_the_ledger_keeps_the_callers_id_beside_ours(gateway_app):
    """The id the caller has (its own, echoed back) is in its record, so support finds the request by it."""
    given = "Root=1-abc/x+y:z.1_2"
    response = await gateway_app.post("/v1/completions", json=body("/v1/completions"),
                                      headers={**gateway_app.key_headers, "x-request-id": given})
    assert response.status_code == 200, response.text
    ours = response.json()["id"].removeprefix("cmpl-")
    record = await record_of(gateway_app, ours)
    assert record["client_request_id"] == given
    unsent = await gateway_app.post("/v1/completions", json=body("/v1/completions"), headers=gateway_app.key_headers)
    assert (await record_of(gateway_app, unsent.headers["x-request-id"]))["client_request_id"] is None


@pytest.mark.parametrize(("path", "payload", "dialect"), [
    ("/v1/completions/generate", body("/v1/completions/generate"), "datacrunch"),
    ("/generate_stream", body("/generate_stream"), "tgi"),
    ("/v1/responses", {"model": MODEL, "input": "Hi"}, "responses"),
    ("/v1/chat/completions", body("/v1/chat/completions"), "openai"),
])
async def test_each_api_is_recorded_as_its_own_dialect(gateway_app, path, payload, dialect):
    """DataCrunch speaks TGI's bodies and the Responses API is OpenAI's, but each is its own API in the ledger
    (the usage API's and the dashboard's `dialect`)."""
    response = await gateway_app.post(path, json=payload, headers=gateway_app.key_headers)
    assert response.status_code == 200, response.text
    assert (await record_of(gateway_app, response.headers["x-request-id"]))["dialect"] == dialect
