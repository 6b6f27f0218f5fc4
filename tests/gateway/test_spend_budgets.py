"""Budgets in money (gateway/serving/budget_gate.py) through the real app: a hard budget without room for a request
answers each dialect's exhausted-quota refusal (OpenAI: 429 `insufficient_quota`; Anthropic: 402 `billing_error`;
the TGI-shaped routes: 402 as Hugging Face answers; never Retry-After), distinct from a rate limit; alerts at
50/80/100 % reach a real local webhook (signed) and a real local SMTP server, once per threshold per period, also
from two gateways; budgets are validated, bounded and tenant-checked; every member
sees them (`GET /v1/team/limits`, the dashboard's Limits page)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import sqlite3
import time

import pytest

from auth.models import SpendBudget
from billing.budgets import period_window
from billing.store import open_store
from billing.store.base import TABLE
from gateway.config import BudgetAlertSettings, Settings
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from gateway.limits.budget_model import BudgetLine
from gateway.serving.budget_alerts import AlertSender
from gateway.serving.budget_gate import BudgetGate
from testkit.protocol_worker import MODEL
from testkit.smtp import smtp_server
from testkit.webhook import webhook_server
from tests.gateway.app_client import ADMIN_HEADERS, ADMIN_KEY, app_client
from tests.gateway.generation_bodies import BODIES, body
from tests.gateway.route_table import envelope

DOLLAR = 1_000_000
# $1 a token: the protocol worker's default answer (3 prompt tokens, 2 generated) costs $5; a completion of "Hi"
# with max_tokens=2 reserves $20 (its bound: gateway/limits/tokens.py)
PRICES = "[pricing.models.default]\ninput = 1000000000000\noutput = 1000000000000\n"
SECRET = "budget-tests-webhook-secret"
LOCAL = ["127.0.0.0/8"]  # the local webhook server: a private network the operator allows here
OPENAI_PATHS = {"/v1/completions", "/v1/chat/completions", "/serverless/v1/completions",
                "/serverless/v1/chat/completions"}
TGI_SHAPED = {"/generate_stream", "/v1/completions/generate"}  # TGI's and DataCrunch's: 402, no error_type


@pytest.fixture
def hooks():
    with webhook_server() as hook:
        yield hook


@pytest.fixture
def mail():
    with smtp_server() as server:
        yield server


def priced_settings(tmp_path, worker, mail, **alerts) -> Settings:
    (tmp_path / "prices.toml").write_text(PRICES)
    model = EndpointSpec(name=MODEL, provisioner=StaticProvisioning(urls=[worker.url]))
    options = dict(allow_http_webhooks=True, webhook_networks=LOCAL, webhook_secret=SECRET, smtp_host=mail.host,
                   smtp_port=mail.port, smtp_starttls=False, timeout_s=30.0, **alerts)
    return Settings(data_dir=str(tmp_path / "data"), models=[model], admin_key=ADMIN_KEY,
                    pricing_file=str(tmp_path / "prices.toml"), budget_alerts=BudgetAlertSettings(**options))


@pytest.fixture
async def priced(tmp_path, worker, mail):
    async with app_client(priced_settings(tmp_path, worker, mail)) as client:
        yield client


async def admin(client, method: str, path: str, **payload):
    return await client.request(method, path, json=payload or None, headers=ADMIN_HEADERS)


async def budget_team(client, name: str, **budget) -> tuple[str, dict[str, str]]:
    """A team with `budget` as its spend budget (other limits off), and the headers of a service key of it."""
    created = await admin(client, "POST", "/admin/teams", name=name, limits={"spend_budget": budget})
    assert created.status_code == 201, created.text
    team = created.json()["id"]
    key = await admin(client, "POST", "/admin/keys", name="svc", team_id=team)
    return team, {"authorization": f"Bearer {key.json()['key']}"}


async def spent(client, headers, micros: int) -> dict:
    """Waits until the team's limits show `micros` spent (the ledger ships its records in the background)."""
    for _ in range(1200):  # a minute at most: it ends as soon as the condition holds
        view = (await client.get("/v1/team/limits", headers=headers)).json()
        if view["budgets"] and view["budgets"][0]["spent_micros"] >= micros:
            return view
        await asyncio.sleep(0.05)
    raise AssertionError(f"spend never reached {micros}: {view}")


async def until(condition, what: str) -> None:
    for _ in range(1200):  # a minute at most: it ends as soon as the condition holds
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(what)


def thresholds(hook) -> list[int]:
    return sorted(json.loads(r.body)["threshold"] for r in hook.received)


async def until_refused(client, headers, most: int = 40) -> int:
    """Small completions ($5 each, $20 reserved) until one is refused; how many were served."""
    for served in range(most):
        answer = await client.post("/v1/completions", json=body("/v1/completions", max_tokens=2), headers=headers)
        if answer.status_code != 200:
            assert answer.json()["error"]["code"] == "insufficient_quota", answer.text
            return served
    raise AssertionError(f"never refused in {most} requests")


async def test_a_spent_hard_budget_is_exhausted_quota_in_each_dialect_with_alerts(priced, hooks, mail):
    _, headers = await budget_team(priced, "Acme", amount_micros=100 * DOLLAR, webhook_url=hooks.url,
                                   emails=["ops@acme.example", "cfo@acme.example"])
    assert await until_refused(priced, headers) == 17  # $85 spent: $20 more would pass $100
    view = await spent(priced, headers, 85 * DOLLAR)
    assert view["budgets"][0]["spent_micros"] == 85 * DOLLAR
    assert view["budgets"][0]["thresholds_reached"] == [50, 80]

    for path in BODIES:
        refused = await priced.post(path, json=body(path), headers=headers)
        assert refused.status_code == (402 if path in TGI_SHAPED else 429), (path, refused.text)
        assert "retry-after" not in refused.headers and "retry-after-ms" not in refused.headers, path
        assert refused.headers["x-should-retry"] == "false"
        # `/generate` is SGLang's here (TGI's shares the path in the route table's sets)
        answer = refused.json()
        error = {"message": answer["error"]["message"]} if path == "/generate" else envelope(path, answer)
        assert "quota" in error["message"] and "monthly budget of 100.00" in error["message"], (path, error)
        if path in OPENAI_PATHS:
            assert refused.json()["error"]["type"] == refused.json()["error"]["code"] == "insufficient_quota"
        if path in TGI_SHAPED:
            assert "error_type" not in answer, path
    messages = await priced.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": BODIES[
        "/v1/chat/completions"]["messages"]}, headers=headers)
    assert messages.status_code == 402 and messages.headers["x-should-retry"] == "false"
    assert messages.json()["type"] == "error" and messages.json()["error"]["type"] == "billing_error"
    assert "retry-after" not in messages.headers and "budget of 100.00" in messages.json()["error"]["message"]
    small = await priced.post("/v1/completions", json=body("/v1/completions", max_tokens=2), headers=headers)
    assert "85.00 used in" in small.json()["error"]["message"] and "resets at" in small.json()["error"]["message"]
    # charted apart from rate limits, whichever status the dialect answered (429 or 402)
    refusals = 1 + len(BODIES) + 2
    window = {"start": time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime(time.time() - 3600)),
              "end": time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime(time.time() + 7200)), "granularity": "hour"}
    for _ in range(1200):  # a minute at most: it ends as soon as the condition holds
        totals = (await priced.get("/v1/usage/overview", params=window, headers=headers)).json()["totals"]
        if totals["requests"] >= 17 + refusals:
            break
        await asyncio.sleep(0.05)
    assert (totals["requests"], totals["budget_refused"], totals["rate_limited"]) == (17 + refusals, refusals, 0)

    await until(lambda: len(hooks.received) >= 2 and len(mail.delivered) >= 2, "two alerts by each channel")
    await asyncio.sleep(0.5)  # a duplicate would arrive meanwhile
    assert thresholds(hooks) == [50, 80]
    for received in hooks.received:  # signed with the configured secret
        mac = hmac.new(SECRET.encode(), received.body, hashlib.sha256).hexdigest()
        assert received.headers["x-sluice-signature"] == f"sha256={mac}"
        assert received.path == "/hooks/budget"
    alert = json.loads(hooks.received[-1].body)
    assert alert["period"] == "month" and alert["hard"] is True and alert["amount_micros"] == 100 * DOLLAR
    assert len(mail.delivered) == 2
    assert all(d.recipients == ["ops@acme.example", "cfo@acme.example"] for d in mail.delivered)
    subjects = sorted(d.message["subject"] for d in mail.delivered)
    assert [re.search(r"reached (\d+)% of its monthly budget", s).group(1) for s in subjects] == ["50", "80"]


async def test_a_rate_limit_stays_a_retryable_429_beside_a_budget(priced):
    team, _ = await budget_team(priced, "Limited", amount_micros=1000 * DOLLAR)
    key = await admin(priced, "POST", "/admin/keys", name="slow", team_id=team, limits={"rpm": 1})
    headers = {"authorization": f"Bearer {key.json()['key']}"}
    assert (await priced.post("/v1/completions", json=body("/v1/completions"), headers=headers)).status_code == 200
    refused = await priced.post("/v1/completions", json=body("/v1/completions"), headers=headers)
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "rate_limit_exceeded" and int(refused.headers["retry-after"]) >= 1
    assert "x-should-retry" not in refused.headers


async def test_a_soft_daily_budget_alerts_and_keeps_serving(priced, hooks):
    _, headers = await budget_team(priced, "Soft", amount_micros=5 * DOLLAR, period="day", hard=False,
                                   webhook_url=hooks.url)
    assert (await priced.post("/generate", json=body("/generate"), headers=headers)).status_code == 200
    view = await spent(priced, headers, 5 * DOLLAR)
    assert view["budgets"][0]["period"] == "day" and view["budgets"][0]["hard"] is False
    assert view["budgets"][0]["resets_at"].endswith("T00:00:00Z")
    assert (await priced.post("/generate", json=body("/generate"), headers=headers)).status_code == 200  # over, served
    await until(lambda: len(hooks.received) >= 3, "three alerts")
    assert thresholds(hooks) == [50, 80, 100]
    assert json.loads(hooks.received[0].body)["period_key"] == time.strftime("%Y-%m-%d", time.gmtime())


async def test_a_keys_budget_refuses_that_key_only(priced):
    team, _ = await budget_team(priced, "Keyed", amount_micros=1000 * DOLLAR)
    capped = await admin(priced, "POST", "/admin/keys", name="capped", team_id=team,
                         limits={"spend_budget": {"amount_micros": 30 * DOLLAR}})
    other = await admin(priced, "POST", "/admin/keys", name="other", team_id=team)
    capped_headers = {"authorization": f"Bearer {capped.json()['key']}"}
    other_headers = {"authorization": f"Bearer {other.json()['key']}"}
    assert await until_refused(priced, capped_headers) == 3  # $15 spent: $20 more would pass $30
    refused = await priced.post("/v1/completions", json=body("/v1/completions", max_tokens=2), headers=capped_headers)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota"
    assert "key's monthly budget" in refused.json()["error"]["message"]
    assert (await priced.post("/v1/completions", json=body("/v1/completions", max_tokens=2),
                              headers=other_headers)).status_code == 200


def month_line(scope: str, amount: int) -> BudgetLine:
    month = period_window("month", time.time())
    return BudgetLine(scope, "micros", "month", month.key, month.start, month.end, amount)


async def test_two_gateways_on_one_database_send_each_threshold_once(tmp_path, hooks):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    stores = [await open_store(url), await open_store(url)]
    settings = BudgetAlertSettings(allow_http_webhooks=True, webhook_networks=LOCAL, timeout_s=30.0)
    gates = [BudgetGate(store, None, AlertSender(settings)) for store in stores]
    budget = SpendBudget(amount_micros=10 * DOLLAR, webhook_url=hooks.url)
    try:
        for gate in gates:  # each gateway sees a settlement cross every threshold and announces them
            for threshold in (50, 80, 100):
                await gate._alert(month_line("team:fleet", 10 * DOLLAR), budget, threshold, 10 * DOLLAR)
        for gate in gates:
            await gate.close()
        assert thresholds(hooks) == [50, 80, 100]
    finally:
        for store in stores:
            await store.close()


async def test_a_failing_webhook_is_retried_a_bounded_number_of_times(tmp_path, hooks):
    hooks.statuses = [500, 500, 500, 500]
    store = await open_store(f"sqlite:///{tmp_path / 'one.db'}")
    gate = BudgetGate(store, None, AlertSender(BudgetAlertSettings(
        allow_http_webhooks=True, webhook_networks=LOCAL, attempts=3, timeout_s=30.0)))
    try:
        line = month_line("team:flaky", DOLLAR)
        await gate._alert(line, SpendBudget(amount_micros=DOLLAR, webhook_url=hooks.url), 50, DOLLAR // 2)
        await gate.close()
        assert len(hooks.received) == 3  # three attempts, then dropped; the threshold stays recorded
        assert not await store.claim_alert("team:flaky", line.period_key, 50, time.time())
    finally:
        await store.close()


@pytest.mark.parametrize(("budget", "field"), [
    ({"amount_micros": 0}, "amount_micros"),
    ({"amount_micros": 10**15 + 1}, "amount_micros"),
    ({"amount_micros": 1, "period": "week"}, "period"),
    ({"amount_micros": 1, "webhook_url": "ftp://hooks.example/x"}, "webhook_url"),
    ({"amount_micros": 1, "webhook_url": "https://user:pw@hooks.example/x"}, "webhook_url"),
    ({"amount_micros": 1, "webhook_url": "https://h.example/" + "x" * 2000}, "webhook_url"),
    ({"amount_micros": 1, "webhook_url": "http://hooks.example/x"}, "webhook_url"),  # https only here
    ({"amount_micros": 1, "emails": ["not-an-address"]}, "emails"),
    ({"amount_micros": 1, "emails": [f"a{i}@x.example" for i in range(11)]}, "emails"),
    ({"amount_micros": 1, "currency": "EUR"}, "currency"),
])
async def test_a_bad_budget_is_refused_naming_its_field(gateway_app, budget, field):
    team = (await admin(gateway_app, "POST", "/admin/teams", name="Valid")).json()["id"]
    for method, path, payload in (("PATCH", f"/admin/teams/{team}", {}), ("POST", "/admin/teams", {"name": "V2"}),
                                  ("POST", "/admin/keys", {"name": "k", "team_id": team})):
        answer = await admin(gateway_app, method, path, **payload, limits={"spend_budget": budget})
        assert answer.status_code == 400, (path, answer.text)
        assert field in answer.text, answer.text
    good = await admin(gateway_app, "PATCH", f"/admin/teams/{team}",
                       limits={"spend_budget": {"amount_micros": DOLLAR, "webhook_url": "https://hooks.example/b"}})
    assert good.status_code == 200 and good.json()["limits"]["spend_budget"]["amount_micros"] == DOLLAR


async def test_budgets_are_the_teams_own(gateway_app):
    """Every member reads its own team's budgets; an owner can neither set a budget (the operator's) nor read
    another team's."""
    mine = (await admin(gateway_app, "POST", "/admin/teams", name="Mine",
                        limits={"spend_budget": {"amount_micros": 7 * DOLLAR}})).json()["id"]
    theirs = (await admin(gateway_app, "POST", "/admin/teams", name="Theirs",
                          limits={"spend_budget": {"amount_micros": 9 * DOLLAR}})).json()["id"]
    headers = {}
    for name, role in (("olga", "owner"), ("mick", "member")):
        user = (await admin(gateway_app, "POST", "/admin/users", name=name)).json()["id"]
        await admin(gateway_app, "PUT", f"/admin/teams/{mine}/members/{user}", role=role)
        key = (await admin(gateway_app, "POST", "/admin/keys", name=name, team_id=mine, user_id=user)).json()["key"]
        headers[role] = {"authorization": f"Bearer {key}"}
    for role in ("owner", "member"):
        view = (await gateway_app.get("/v1/team/limits", headers=headers[role])).json()
        assert view["team_id"] == mine and [b["amount_micros"] for b in view["budgets"]] == [7 * DOLLAR]
        other = await gateway_app.get("/v1/team/limits", headers={**headers[role], "x-team-id": theirs})
        assert other.status_code in (403, 404) and str(9 * DOLLAR) not in other.text
    for method, path in (("PATCH", f"/admin/teams/{mine}"), ("PATCH", f"/admin/teams/{theirs}")):
        answer = await gateway_app.request(method, path, headers=headers["owner"],
                                       json={"limits": {"spend_budget": {"amount_micros": 10**12}}})
        assert answer.status_code == 403, answer.text
    assert (await gateway_app.get(f"/admin/teams/{theirs}", headers=headers["owner"])).status_code in (403, 405)


async def test_the_limits_page_shows_every_member_the_budgets_and_resets(priced):
    team, service = await budget_team(priced, "Paged", amount_micros=38 * DOLLAR)
    for _ in range(4):  # $20 spent, 52 %: $20 more would pass $38
        assert (await priced.post("/v1/completions", json=body("/v1/completions", max_tokens=2),
                                  headers=service)).status_code == 200
    await spent(priced, service, 20 * DOLLAR)
    user = (await admin(priced, "POST", "/admin/users", name="mia")).json()["id"]
    await admin(priced, "PUT", f"/admin/teams/{team}/members/{user}", role="member")
    key = (await admin(priced, "POST", "/admin/keys", name="mia", team_id=team, user_id=user,
                       limits={"rpm": 30})).json()["key"]
    csrf = re.search(r'name="csrf" value="([^"]+)"', (await priced.get("/dashboard/login")).text).group(1)
    signed = await priced.post("/dashboard/login", data={"csrf": csrf, "api_key": key}, follow_redirects=False)
    assert signed.status_code == 303, signed.text
    page = await priced.get("/dashboard/limits")
    assert page.status_code == 200, page.text
    row = re.search(rf'<tr data-scope="team:{team}">.*?</tr>', page.text).group(0)
    assert 'data-micros="20000000"' in row and 'data-micros="38000000"' in row and 'data-thresholds="50"' in row
    assert "requests refused" in row and "T00:00:00Z" in row
    # the member's own key's rpm
    assert re.search(r'<tr data-scope="key:[^"]+">.*?data-label="Requests / min"><span data-n="30">30</span></td>',
                     page.text)
    assert 'href="/dashboard/limits?team_id=' in page.text and 'aria-current="page">Limits' in page.text


async def test_a_budget_the_ledger_cannot_tell_refuses_for_now(priced, tmp_path):
    """A budget's counter starts from the ledger: while the ledger cannot be read, its requests get a 503 with
    Retry-After (never served unchecked), and the next request after it returns reads it again."""
    _, headers = await budget_team(priced, "Unread", amount_micros=100 * DOLLAR)
    with sqlite3.connect(tmp_path / "data" / "sluice.db") as db:  # the usage table goes away under the gateway
        db.execute(f"ALTER TABLE {TABLE} RENAME TO gone")
    refused = await priced.post("/v1/completions", json=body("/v1/completions", max_tokens=2), headers=headers)
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1, refused.text
    assert refused.json()["error"]["code"] == "budget_unavailable"
    with sqlite3.connect(tmp_path / "data" / "sluice.db") as db:
        db.execute(f"ALTER TABLE gone RENAME TO {TABLE}")
    served = await priced.post("/v1/completions", json=body("/v1/completions", max_tokens=2), headers=headers)
    assert served.status_code == 200, served.text
