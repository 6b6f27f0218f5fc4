"""Alerts on a team's error rate and latency (gateway/serving/health_alerts.py) through the real gateway app in
front of the protocol worker: owners set them (`PUT|DELETE /v1/team/alerts`; bounded, tenant-checked, destinations
under the outbound rule), and each fires once per crossing above its threshold, to a real local webhook (signed)
and a real local SMTP server, and again only after the measure fell back below it; judged on the fleet's
numbers (every gateway's records in the shared ledger) and sent once fleet-wide, checked with two gateways on one
PostgreSQL."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from gateway.serving.budget_alerts import sign
from testkit.databases import create_database, drop_database
from testkit.protocol_worker import Reply, tokens
from tests.gateway.app_client import ADMIN_HEADERS, app_client
from tests.gateway.generation_bodies import body
from tests.gateway.test_spend_budgets import SECRET, hooks, mail, priced_settings  # noqa: F401 - fixtures

OK = Reply(tokens())
FAILED = Reply.dropped(tokens()[:2])  # the worker dies after the first token: an error, never retried


@pytest.fixture
async def watched(tmp_path, worker, mail):  # noqa: F811 - the fixture imported above
    async with app_client(priced_settings(tmp_path, worker, mail, email_domains=["acme.example"])) as client:
        yield client


async def _admin(client, method: str, path: str, **payload) -> dict:
    answer = await client.request(method, path, json=payload or None, headers=ADMIN_HEADERS)
    assert answer.status_code < 300, answer.text
    return answer.json()


async def _until(condition, what: str) -> None:
    for _ in range(600):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(what)


async def test_error_rate_alerts_fire_once_per_crossing(watched, worker, hooks, mail):  # noqa: F811
    team = (await _admin(watched, "POST", "/admin/teams", name="Acme"))["id"]
    owner_id = (await _admin(watched, "POST", "/admin/users", name="olga"))["id"]
    member_id = (await _admin(watched, "POST", "/admin/users", name="mo"))["id"]
    await _admin(watched, "PUT", f"/admin/teams/{team}/members/{owner_id}", role="owner")
    await _admin(watched, "PUT", f"/admin/teams/{team}/members/{member_id}", role="member")
    owner = {"authorization": "Bearer " + (await _admin(watched, "POST", "/admin/keys", name="o", team_id=team,
                                                        user_id=owner_id))["key"]}
    member = {"authorization": "Bearer " + (await _admin(watched, "POST", "/admin/keys", name="m", team_id=team,
                                                         user_id=member_id))["key"]}
    service = {"authorization": "Bearer " + (await _admin(watched, "POST", "/admin/keys", name="s",
                                                          team_id=team))["key"]}
    alerts = {"error_rate_percent": 30, "min_requests": 4, "window_s": 300, "webhook_url": hooks.url,
              "emails": ["ops@acme.example"]}

    async def put(headers, **fields):
        return await watched.put("/v1/team/alerts", json=fields, headers=headers)

    assert (await put(member, **alerts)).status_code == 403
    for bad in ({"error_rate_percent": 0}, {"error_rate_percent": 101}, {"latency_p95_ms": 0},
                {"error_rate_percent": 5, "window_s": 10}, {"window_s": 300},  # neither threshold
                {"error_rate_percent": 5, "webhook_url": "http://10.0.0.9/hook"},
                {"error_rate_percent": 5, "emails": ["boss@elsewhere.example"]},
                {"error_rate_percent": 5, "emails": ["x"]}, {"error_rate_percent": 5, "nope": 1}):
        assert (await put(owner, **bad)).status_code == 400, bad
    on_key = await watched.post("/v1/team/keys", json={"name": "k", "limits": {"health_alerts": alerts}},
                                headers=owner)
    assert on_key.status_code == 400 and "health_alerts" in on_key.text
    done = await put(owner, **alerts)
    assert done.status_code == 200 and done.json()["health_alerts"]["error_rate_percent"] == 30

    async def send(*replies: Reply) -> None:
        for reply in replies:
            worker.replies = [reply]
            await watched.post("/v1/completions", json=body("/v1/completions", max_tokens=2), headers=service)

    await send(OK, OK, OK, OK)  # 0 %
    await send(FAILED, FAILED)  # 2 of 6: 33 %, above 30 %: one alert
    await _until(lambda: hooks.received and mail.delivered, "the first alert by both channels")
    await send(FAILED, FAILED)  # 4 of 8, still above: no second alert
    await send(*[OK] * 8)  # 4 of 16: 25 %, below: armed again
    await send(FAILED, FAILED)  # 6 of 18: 33 %: the second alert
    await _until(lambda: len(hooks.received) >= 2 and len(mail.delivered) >= 2, "the second alert")
    await asyncio.sleep(0.5)  # a duplicate would arrive meanwhile
    assert len(hooks.received) == 2 and len(mail.delivered) == 2
    first = json.loads(hooks.received[0].body)
    assert (first["scope"], first["measure"], first["threshold"], first["value"]) == (
        f"team:{team}", "error_rate", 30, 33.33)
    assert hooks.received[0].headers["x-sluice-signature"] == sign(SECRET, hooks.received[0].body)
    assert mail.delivered[0].recipients == ["ops@acme.example"]
    assert "error rate 33.33% is above 30%" in mail.delivered[0].message["subject"]

    # latency: the p95 of answered requests over the window
    await put(owner, latency_p95_ms=150, min_requests=2, webhook_url=hooks.url)
    await send(Reply.counted(token_delay=0.2), Reply.counted(token_delay=0.2))
    await _until(lambda: len(hooks.received) >= 3, "the latency alert")
    latency = json.loads(hooks.received[2].body)
    assert latency["measure"] == "latency_p95" and latency["value"] > 150
    assert (await watched.delete("/v1/team/alerts", headers=owner)).json().get("health_alerts") is None


@pytest.fixture
async def fleet(tmp_path, worker, mail, postgres):  # noqa: F811 - the fixtures imported above
    """Two gateways on one PostgreSQL (auth and ledger, one key pepper), each with its own data dir and ledger log."""
    url = await create_database(postgres.url, "health")
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    gateways = [msgspec.structs.replace(priced_settings(tmp_path / name, worker, mail, email_domains=["acme.example"]),
                                        database_url=url, key_pepper="health-fleet-pepper-0123456789")
                for name in ("a", "b")]
    async with app_client(gateways[0]) as a, app_client(gateways[1]) as b:
        yield a, b
    await drop_database(postgres.url, url)


async def test_two_gateways_judge_the_fleets_numbers_and_alert_once(fleet, worker, hooks, mail):  # noqa: F811
    """Neither gateway alone settles `min_requests` requests, so only the fleet's numbers can cross; both judge
    every crossing, one alert goes out."""
    a, b = fleet
    team = (await _admin(a, "POST", "/admin/teams", name="Fleet"))["id"]
    owner_id = (await _admin(a, "POST", "/admin/users", name="fay"))["id"]
    await _admin(a, "PUT", f"/admin/teams/{team}/members/{owner_id}", role="owner")
    owner = {"authorization": "Bearer " + (await _admin(a, "POST", "/admin/keys", name="o", team_id=team,
                                                        user_id=owner_id))["key"]}
    done = await a.put("/v1/team/alerts", headers=owner, json={
        "error_rate_percent": 30, "min_requests": 4, "window_s": 300, "webhook_url": hooks.url,
        "emails": ["ops@acme.example"]})
    assert done.status_code == 200, done.text

    sent = 0

    async def send(gateway, *replies: Reply) -> None:
        nonlocal sent
        for reply in replies:
            worker.replies = [reply]
            await gateway.post("/v1/completions", json=body("/v1/completions", max_tokens=2), headers=owner)
        sent += len(replies)
        # in the shared ledger (each gateway's shipper lingers a second) before the other gateway's next request
        window = {"group_by": "none", "start": "2000-01-01", "end": "2100-01-01"}
        for _ in range(1200):  # a minute at most: it ends as soon as the sums agree
            usage = await a.get("/v1/usage", params=window, headers=owner)
            if usage.json()["totals"]["requests"] == sent:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the records never reached the shared ledger")

    await send(a, OK, OK)
    await send(b, OK)
    await send(a, FAILED)  # 1 of 4 in the fleet: 25 %
    await send(b, FAILED)  # 2 of 5: 40 % (a: 1 of 3, b: 1 of 2, each under min_requests)
    await _until(lambda: hooks.received and mail.delivered, "the fleet's alert")
    await send(a, FAILED)
    await send(b, FAILED)  # still above, judged by both: no second alert
    await send(b, *[OK] * 10)  # 4 of 17: below, armed again
    await send(a, FAILED)  # 5 of 18: 27.8 %
    await send(b, FAILED)  # 6 of 19: 31.6 %: the second crossing
    await _until(lambda: len(hooks.received) >= 2, "the second crossing's alert")
    await asyncio.sleep(1.0)  # a duplicate from the other gateway would arrive meanwhile
    assert len(hooks.received) == 2 and len(mail.delivered) == 2
    first, second = (json.loads(hook.body) for hook in hooks.received)
    assert (first["measure"], first["value"], first["requests"]) == ("error_rate", 40.0, 5)
    assert (second["value"], second["requests"]) == (31.58, 19)
