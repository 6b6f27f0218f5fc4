"""Owners run their team's budgets (auth/budget_rules.py) in the dashboard and through `/v1/team`: the team's
budget in money and monthly tokens on the Limits page, each key's in the key create and edit forms, with alert
destinations, never above the operator's ceiling (refused at the field, nothing changed); a member, another team
and an alert destination the operator's rule refuses are each refused. As a user would click it in Chromium: the
owner sets a key's budget, the key spends it, the alert reaches a real local webhook and SMTP server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from gateway.config import BudgetAlertSettings, Settings
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from testkit.protocol_worker import MODEL, protocol_worker
from testkit.servers import free_port
from testkit.smtp import smtp_server
from testkit.webhook import webhook_server
from tests.gateway.dashboard.served import ADMIN_KEY, served_gateway
from tests.gateway.dashboard.test_dashboard_accessibility import sign_in, violations
from tests.gateway.dashboard.test_dashboard_details import signed_in
from tests.gateway.dashboard.test_dashboard_key_edit import csrf, field_error
from tests.gateway.generation_bodies import body

pytestmark = pytest.mark.slow

DOLLAR = 1_000_000
# $1 a token: the protocol worker's answer (3 prompt tokens, 2 generated) costs $5; max_tokens=2 reserves $20
PRICES = "[pricing.models.default]\ninput = 1000000000000\noutput = 1000000000000\n"
CEILING = {"spend_micros": 100 * DOLLAR, "monthly_tokens": 1_000_000}


@pytest.fixture
def hooks():
    with webhook_server() as hook:
        yield hook


@pytest.fixture
def mail():
    with smtp_server() as server:
        yield server


@contextlib.asynccontextmanager
async def priced_gateway(folder: Path, alerts: BudgetAlertSettings | None = None) -> AsyncIterator:
    """The served gateway in front of a protocol worker, at $1 a token, sending alerts as `alerts` says."""
    (folder / "prices.toml").write_text(PRICES)
    with protocol_worker() as worker:
        model = EndpointSpec(name=MODEL, provisioner=StaticProvisioning(urls=[worker.url]))
        settings = Settings(data_dir=str(folder / "data"), port=free_port(), models=[model], admin_key=ADMIN_KEY,
                            pricing_file=str(folder / "prices.toml"), log_format="console",
                            budget_alerts=alerts or BudgetAlertSettings())
        async with served_gateway(settings) as server:
            yield server


@pytest.fixture
async def served(tmp_path, hooks, mail):
    alerts = BudgetAlertSettings(allow_http_webhooks=True, webhook_networks=["127.0.0.0/8"],
                                 email_domains=["acme.example"], smtp_host=mail.host, smtp_port=mail.port,
                                 smtp_starttls=False, timeout_s=30.0)
    async with priced_gateway(tmp_path, alerts) as server:
        yield server


async def team_limits(served, team: str) -> dict | None:
    teams = (await served.admin("GET", "/admin/teams"))["data"]
    return next(t for t in teams if t["id"] == team)["limits"]


async def _acme(served) -> dict:
    """Acme (the operator's ceiling: $100 a period, 1M tokens a month) owned by olga with member mo; Other, owned
    by ozzie, without a ceiling."""
    team = (await served.admin("POST", "/admin/teams", name="Acme", limits={"ceiling": CEILING}))["id"]
    olga, mo = [(await served.admin("POST", "/admin/users", name=n))["id"] for n in ("olga", "mo")]
    await served.admin("PUT", f"/admin/teams/{team}/members/{olga}", role="owner")
    await served.admin("PUT", f"/admin/teams/{team}/members/{mo}", role="member")
    owner = await served.admin("POST", "/admin/keys", name="olga", team_id=team, user_id=olga)
    member = await served.admin("POST", "/admin/keys", name="mo", team_id=team, user_id=mo)
    other, _, ozzie = await served.owned_team("Other", "ozzie", "ozzie")
    return {"id": team, "owner": owner["key"], "member": member["key"], "other": other, "ozzie": ozzie["key"]}


async def test_owner_sets_a_key_budget_the_key_spends_it_and_the_alert_arrives(served, hooks, mail, page):
    acme = await _acme(served)
    await sign_in(page, served, acme["owner"])
    await page.goto(f"{served.url}/dashboard/limits?team_id={acme['id']}")
    assert "$100.00" in await page.inner_text("#ceiling")
    await page.fill("#team-spend_amount", "1000")  # above the ceiling
    await page.fill("#team-monthly_token_budget", "500000")
    await page.click("#save-budgets")
    assert "at most the operator's ceiling for this team, $100.00" in await page.inner_text("#spend_amount-error")
    assert await page.input_value("#team-spend_amount") == "1000"  # as typed
    assert await violations(page) == []
    await page.fill("#team-spend_amount", "100")
    await page.click("#save-budgets")
    await page.wait_for_url("**/dashboard/limits?**")
    assert (await team_limits(served, acme["id"]))["spend_budget"] == {
        "amount_micros": 100 * DOLLAR}

    # a new service key with models, a rate and its own budget, alerting a webhook and an inbox
    await page.goto(f"{served.url}/dashboard/keys?team_id={acme['id']}")
    await page.fill("#key-name", "nightly")
    await page.click("#new-key-grants summary")
    await page.fill("#key-models", MODEL)
    await page.fill("#key-rpm", "600")
    await page.fill("#key-spend_amount", "101")  # above the ceiling: said at the field, nothing created
    await page.click("#create-key")
    assert "$100.00" in await page.inner_text("#spend_amount-error")
    assert await page.input_value("#key-name") == "nightly"
    assert await violations(page) == []
    await page.fill("#key-spend_amount", "30")
    await page.fill("#key-spend_webhook", f"{hooks.url}/key")
    await page.fill("#key-spend_emails", "ops@acme.example")
    await page.click("#create-key")
    secret = (await page.inner_text("#new-key")).strip()
    keys = (await served.admin("GET", "/admin/keys"))["data"]
    made = next(k for k in keys if k["name"] == "nightly")
    assert made["models"] == [MODEL] and made["limits"]["rpm"] == 600
    assert made["limits"]["spend_budget"]["amount_micros"] == 30 * DOLLAR

    # raised to $40 in the edit form (the destinations stay as shown)
    await page.goto(f"{served.url}/dashboard/keys/{made['id']}/edit?team_id={acme['id']}")
    assert await page.input_value("#edit-spend_webhook") == f"{hooks.url}/key"
    await page.fill("#edit-spend_amount", "40")
    await page.click("#save-key")
    await page.wait_for_url("**/dashboard/keys?**")
    assert "$40.00 a month, hard" in await page.inner_text(f"tr[data-key-id='{made['id']}'] [data-limits]")
    assert await violations(page) == []

    # the key spends it: $5 a request, $20 reserved; the 6th would pass $40
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        headers = {"authorization": f"Bearer {secret}"}
        answers = [await client.post("/v1/completions", json=body("/v1/completions", model=MODEL, max_tokens=2),
                                     headers=headers) for _ in range(6)]
    assert [a.status_code for a in answers] == [200] * 5 + [429], answers[-1].text
    assert answers[-1].json()["error"]["code"] == "insufficient_quota"
    for _ in range(1200):  # a minute at most: it ends as soon as the condition holds
        if hooks.received and mail.delivered:
            break
        await asyncio.sleep(0.05)
    alert = json.loads(hooks.received[0].body)
    assert (alert["threshold"], alert["amount_micros"]) == (50, 40 * DOLLAR)
    assert hooks.received[0].path.endswith("/key") and len(hooks.received) == 1  # once: 62.5 % crossed only 50
    assert mail.delivered[0].recipients == ["ops@acme.example"]
    assert re.search(r"reached 50% of its monthly budget", mail.delivered[0].message["subject"])


@pytest.mark.parametrize(("fields", "field", "says"), [
    ({"spend_amount": "1e3"}, "spend_amount", "digits 0-9"),
    ({"spend_amount": "1.0000001"}, "spend_amount", "digits 0-9"),
    ({"spend_amount": "٣"}, "spend_amount", "digits 0-9"),
    ({"spend_amount": "0"}, "spend_amount", "digits 0-9"),
    ({"spend_amount": "5", "spend_period": "year"}, "spend_period", "month or day"),
    ({"spend_amount": "5", "spend_webhook": "ftp://x.example/h"}, "spend_webhook", "https://"),
    ({"spend_amount": "5", "spend_webhook": "http://10.1.2.3/h"}, "spend_webhook", "not a public address"),
    ({"spend_amount": "5", "spend_emails": "not-an-address"}, "spend_emails", "e-mail"),
    ({"spend_amount": "5", "spend_emails": ", ".join(f"a{i}@acme.example" for i in range(11))}, "spend_emails",
     "At most 10"),
    ({"spend_amount": "5", "spend_emails": "boss@elsewhere.example"}, "spend_emails", "domains the operator allows"),
    ({"spend_emails": "ops@acme.example"}, "spend_amount", "need a budget"),
    ({"spend_amount": "5", "monthly_token_budget": "-1"}, "monthly_token_budget", "digits 0-9"),
    ({"spend_amount": "5", "monthly_token_budget": "1000001"}, "monthly_token_budget", "ceiling"),
    ({"spend_amount": "5"}, "spend_hard", "must be hard"),  # an unchecked box: alerts only
])
async def test_a_bad_budget_field_is_said_at_the_field_and_changes_nothing(served, fields, field, says):
    acme = await _acme(served)
    before = (await team_limits(served, acme["id"]))
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        await signed_in(client, acme["owner"])
        form = (await client.get("/dashboard/limits", params={"team_id": acme["id"]})).text
        hard = {} if field == "spend_hard" else {"spend_hard": "on"}
        answer = await client.post("/dashboard/limits/budgets", params={"team_id": acme["id"]},
                                   data={"csrf": csrf(form), "spend_period": "month", **hard, **fields})
    assert answer.status_code in (400, 403) and says in field_error(answer.text, field), answer.text[-2000:]
    assert (await team_limits(served, acme["id"])) == before


async def test_who_may_set_which_teams_budgets(served):
    acme = await _acme(served)

    async def put(key: str, team: str, **budgets) -> httpx.Response:
        async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
            return await client.put("/v1/team/budgets", json=budgets, headers={
                "authorization": f"Bearer {key}", "x-team-id": team})

    ok = {"spend_budget": {"amount_micros": 50 * DOLLAR}, "monthly_token_budget": 1000}
    assert (await put(acme["member"], acme["id"], **ok)).status_code == 403
    assert (await put(acme["ozzie"], acme["id"], **ok)).status_code == 403  # another team's owner
    no_ceiling = await put(acme["ozzie"], acme["other"], **ok)
    assert no_ceiling.status_code == 403 and no_ceiling.json()["error"]["code"] == "no_ceiling"
    above = await put(acme["owner"], acme["id"], spend_budget={"amount_micros": 100 * DOLLAR + 1},
                      monthly_token_budget=1000)
    assert above.status_code == 403 and above.json()["error"]["code"] == "above_ceiling"
    assert above.json()["error"]["param"] == "spend_budget.amount_micros"
    for bad in ({"spend_budget": {"amount_micros": 0}}, {"monthly_token_budget": -1}, {"ceiling": CEILING},
                {"spend_budget": {"amount_micros": DOLLAR, "webhook_url": "http://169.254.169.254/x"}}):
        assert (await put(acme["owner"], acme["id"], **bad)).status_code == 400, bad
    done = await put(acme["owner"], acme["id"], **ok)
    assert done.status_code == 200, done.text
    assert done.json() == {**ok, "ceiling": CEILING}
    # the operator moves the ceiling; owners never can through a key's limits
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        sneaky = await client.post("/v1/team/keys", json={"name": "x", "limits": {"ceiling": {"spend_micros": 1}}},
                                   headers={"authorization": f"Bearer {acme['owner']}", "x-team-id": acme["id"]})
    assert sneaky.status_code == 400 and "ceiling" in sneaky.text
    # a member sees the budgets but no form, and cannot post one
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        await signed_in(client, acme["member"])
        page = (await client.get("/dashboard/limits", params={"team_id": acme["id"]})).text
        assert 'id="team-budgets"' not in page
        posted = await client.post("/dashboard/limits/budgets", params={"team_id": acme["id"]},
                                   data={"csrf": csrf(page), "spend_amount": "1"})
        assert posted.status_code == 403
    assert (await team_limits(served, acme["id"]))["spend_budget"] == {
        "amount_micros": 50 * DOLLAR}


@pytest.mark.parametrize(("fields", "field", "says"), [
    ({"error_rate_percent": "0"}, "error_rate_percent", ">= 1"),
    ({"error_rate_percent": "1e2"}, "error_rate_percent", "digits 0-9"),
    ({"latency_p95_ms": "500", "window_s": "10"}, "window_s", ">= 60"),
    ({"error_rate_percent": "5", "alert_webhook": "http://10.1.2.3/h"}, "alert_webhook", "not a public address"),
    ({"error_rate_percent": "5", "alert_emails": "boss@elsewhere.example"}, "alert_emails", "domains"),
])
async def test_owners_set_health_alerts_on_the_limits_page(served, hooks, fields, field, says):
    acme = await _acme(served)
    base = {"error_rate_percent": "", "latency_p95_ms": "", "window_s": "300", "min_requests": "20",
            "alert_webhook": "", "alert_emails": ""}
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        await signed_in(client, acme["owner"])
        form = (await client.get("/dashboard/limits", params={"team_id": acme["id"]})).text
        assert 'id="team-alerts"' in form
        refused = await client.post("/dashboard/limits/alerts", params={"team_id": acme["id"]},
                                    data={"csrf": csrf(form), **base, **fields})
        assert refused.status_code in (400, 403) and says in field_error(refused.text, field), refused.text[-1500:]
        assert (await team_limits(served, acme["id"])).get("health_alerts") is None
        saved = await client.post("/dashboard/limits/alerts", params={"team_id": acme["id"]}, data={
            "csrf": csrf(form), **base, "error_rate_percent": "25", "alert_webhook": f"{hooks.url}/h",
            "alert_emails": "ops@acme.example"}, follow_redirects=False)
        assert saved.status_code == 303
    stored = (await team_limits(served, acme["id"]))["health_alerts"]
    assert (stored["error_rate_percent"], stored.get("window_s", 300), stored["webhook_url"], stored["emails"]) == (
        25, 300, f"{hooks.url}/h", ["ops@acme.example"])
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        await signed_in(client, acme["member"])
        page = (await client.get("/dashboard/limits", params={"team_id": acme["id"]})).text
        assert 'id="team-alerts"' not in page
        posted = await client.post("/dashboard/limits/alerts", params={"team_id": acme["id"]},
                                   data={"csrf": csrf(page), **base})
        assert posted.status_code == 403
