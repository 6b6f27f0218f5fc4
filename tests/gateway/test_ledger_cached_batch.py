"""Cached prompt tokens and batch marks as the gateway records them (gateway/serving/accounting.py), through the real
gateway app in front of the protocol worker, with a pricing file that has a cached-input price and a batch discount:
an interactive request whose prompt the worker's prefix cache partly supplied is recorded with its cached tokens and
priced by them; a request run through the pipeline's stages with a batch mark (`Accounting(batch=BatchMark(...))`,
as a batch runner builds it) is recorded with its batch id and custom_id, cut to their bounds, at the batch rate. A
team reads both in its own records, never another team's. The real worker's prefix cache: tests/e2e/test_ledger_e2e.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from litestar import Request
from litestar.testing import AsyncTestClient

from billing.batch_mark import BatchMark
from billing.records import Price
from common.protocol import Accepted, Done, Finish, Token
from gateway.config import Settings
from gateway.dialects.openai.routes import CHAT
from gateway.edge.app import create_app
from gateway.edge.lifespan import STATE_FAILURE
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from gateway.serving.accounting import Accounting
from gateway.serving.context import RequestContext
from gateway.serving.pipeline import admit, authorize, lease, parse, relay
from testkit.protocol_worker import MODEL, Reply
from tests.gateway.app_client import ADMIN_KEY, new_key
from tests.gateway.test_request_scope import record_of

PRICE = Price(1_000_000, 4_000_000, 250_000, 50)  # $1 in, $0.25 cached in, $4 out per million; batch half price
ROUTE = "/v1/chat/completions"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 1}
# a prompt of 60 tokens whose first 48 came from the worker's prefix cache (tests/worker/engine/test_prefix_cache.py)
CACHED = [Accepted(prompt_tokens=60, prompt_ids=list(range(60)), seeds=[1]), Token(index=0, token_id=5, text="Hi"),
          Finish(index=0, reason="length", text="Hi", token_ids=[5], seed=1),
          Done(prompt_tokens=60, completion_tokens=1, compute_tokens=1, cached_tokens=48)]


@pytest.fixture
def gateway_settings(worker, tmp_path) -> Settings:
    prices = tmp_path / "prices.toml"
    prices.write_text(f'[pricing.models."{MODEL}"]\ninput = {PRICE.input_micros}\noutput = {PRICE.output_micros}\n'
                      f"cached_input = {PRICE.cached_input_micros}\n"
                      f"batch_discount_percent = {PRICE.batch_discount_percent}\n")
    model = EndpointSpec(name=MODEL, provisioner=StaticProvisioning(urls=[worker.url]))
    return Settings(data_dir=str(tmp_path), models=[model], admin_key=ADMIN_KEY, pricing_file=str(prices))


async def own_records(gateway_app, headers) -> dict[str, dict]:
    listed = await gateway_app.get("/v1/usage/requests?limit=100", headers=headers)
    assert listed.status_code == 200, listed.text
    return {r["request_id"]: r for r in listed.json()["data"]}


async def test_an_interactive_request_records_and_prices_its_cached_prompt_tokens(gateway_app, worker):
    worker.replies = [Reply(CACHED)]
    answer = await gateway_app.post(ROUTE, json=BODY, headers=gateway_app.key_headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 48}  # what the client was told
    record = await record_of(gateway_app, answer.headers["x-request-id"])
    # 12 prompt tokens at $1, 48 at $0.25, 1 output token at $4 a million
    assert (record["cached_tokens"], record["batch_id"], record["custom_id"]) == (48, None, None)
    assert (record["cost_micros"], record["cache_saved_micros"], record["batch_saved_micros"]) == (28, 36, 0)
    assert record["cost_micros"] == PRICE.charge(60, 1, cached_tokens=48).cost_micros


async def _never_disconnects() -> dict:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


async def run_batch_line(gateway_app, key: str, mark: BatchMark, request_id: str) -> dict:
    """One batch line through the pipeline's stages (parse -> authorize -> admit -> lease -> relay -> settle), as a
    batch runner drives them: no HTTP request of its own, the team's key, the line's mark on its accounting. On
    the app's own event loop (the test client's portal thread): its stores' locks belong to that loop, and one
    that had waiters there refused this test's loop."""
    return await asyncio.to_thread(gateway_app.blocking_portal.call, _run_batch_line, gateway_app, key, mark,
                                   request_id)


async def _run_batch_line(gateway_app, key: str, mark: BatchMark, request_id: str) -> dict:
    services = gateway_app.app.state.services
    principal = await services.auth.authenticate(f"Bearer {key}", None, "127.0.0.1")
    scope = {"type": "http", "method": "POST", "path": ROUTE, "raw_path": ROUTE.encode(), "root_path": "",
             "query_string": b"", "headers": [], "state": {}, "app": gateway_app.app, "scheme": "http",
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "http_version": "1.1", "path_params": {}}
    request = Request(scope, receive=_never_disconnects)
    accounting = Accounting(services, principal, request_id, CHAT.name, ROUTE, {}, batch=mark)
    context = RequestContext(request, services, CHAT, ROUTE, request_id, principal, accounting)
    try:
        await parse(context, BODY)
        authorize(context)
        await admit(context)
        response = await relay(context, await lease(context))
    finally:
        context.release_leases()
    assert context.status == "ok" and accounting.batch is mark  # settled by the pipeline, before the answer
    return json.loads(response.content)


async def test_a_batch_line_is_recorded_with_its_mark_at_the_batch_rate(gateway_app, worker):
    key = (await gateway_app.post("/admin/keys", headers=gateway_app.admin_headers, json={
        "name": "batch runner", "team_id": await default_team(gateway_app)})).json()["key"]
    worker.replies = [Reply(CACHED), Reply(CACHED)]
    marks = [BatchMark("batch_0123", "eval-row-17"), BatchMark("b" * 500, "=HYPERLINK(\"x\")" + "c" * 500)]
    for i, mark in enumerate(marks):
        answer = await run_batch_line(gateway_app, key, mark, f"batch-line-{i}")
        assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 48}
    records = [await record_of(gateway_app, f"batch-line-{i}") for i in range(2)]
    first, cut = records
    assert (first["batch_id"], first["custom_id"], first["cached_tokens"]) == ("batch_0123", "eval-row-17", 48)
    # half of 28: the cached price and the batch discount together
    assert (first["cost_micros"], first["cache_saved_micros"], first["batch_saved_micros"]) == (14, 36, 14)
    assert first["batch_discount_percent"] == 50 and first["cached_input_price_micros"] == 250_000
    assert (len(cut["batch_id"]), len(cut["custom_id"])) == (128, 256) and cut["batch_id"].endswith("…")
    # the team's own records show them; another team's key sees none of them
    mine = await own_records(gateway_app, {"authorization": f"Bearer {key}"})
    assert {"batch-line-0", "batch-line-1"} <= set(mine) and mine["batch-line-0"]["batch_id"] == "batch_0123"
    other_team = (await gateway_app.post("/admin/teams", headers=gateway_app.admin_headers,
                                         json={"name": "other"})).json()["id"]
    theirs = (await gateway_app.post("/admin/keys", headers=gateway_app.admin_headers,
                                     json={"name": "theirs", "team_id": other_team})).json()["key"]
    assert not {"batch-line-0", "batch-line-1"} & set(await own_records(gateway_app,
                                                                        {"authorization": f"Bearer {theirs}"}))
    # the team's usage sums carry the batch spend and what it saved
    usage = (await gateway_app.get("/v1/usage?group_by=none", headers={"authorization": f"Bearer {key}"})).json()
    assert (usage["totals"]["batch_requests"], usage["totals"]["batch_cost_micros"]) == (2, 28)
    assert usage["totals"]["cached_tokens"] == 96


async def default_team(gateway_app) -> str:
    teams = (await gateway_app.get("/admin/teams", headers=gateway_app.admin_headers)).json()["data"]
    return next(team["id"] for team in teams if team["name"] == "default")


async def test_a_key_of_the_team_that_made_no_request_has_no_batch_spend(gateway_app):
    usage = (await gateway_app.get("/v1/usage?group_by=none", headers=await new_key(gateway_app))).json()
    assert (usage["totals"]["batch_requests"], usage["totals"]["cached_tokens"]) == (0, 0)


@pytest.mark.parametrize(("fields", "words"), [
    ("cached_input = 2000000\n", ("cached_input", "above its input price")),
    ("batch_discount_percent = 120\n", ("batch_discount_percent", "0 to 100")),
    ('batch_discount_percent = "half"\n', ("batch_discount_percent",))])
async def test_a_bad_cached_or_batch_price_stops_the_gateway_with_one_line(gateway_settings, fields, words):
    with open(gateway_settings.pricing_file, "w") as prices:
        prices.write(f'[pricing.models."{MODEL}"]\ninput = 1000000\noutput = 4000000\n{fields}')
    app = create_app(gateway_settings, supervise=False)
    with pytest.raises(ExceptionGroup):  # the lifespan's StartupError, through the test client's task group
        async with AsyncTestClient(app=app):
            pass
    failure = app.state[STATE_FAILURE]
    assert "\n" not in failure and "pricing_file" in failure and all(w in failure for w in words), failure
