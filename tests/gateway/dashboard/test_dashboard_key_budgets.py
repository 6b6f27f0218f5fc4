"""Keys with a budget in money on the keys page, in Chromium: the page lists them (owners and the admin), each
row shows the budget and its spend this period, and an action that commits (create, rotate) always shows its new
key."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.billing.factory import usage
from tests.gateway.dashboard.served import ADMIN_KEY

pytestmark = pytest.mark.slow

DOLLAR = 1_000_000


@pytest.fixture
async def budgeted(dashboard_server) -> dict:
    """Acme with owner alice; `batch`, a service key with a hard budget of $1 a month, spent to 117 %; `old`, a
    revoked service key with an alerts-only budget of $2 a day."""
    team, _, alice = await dashboard_server.owned_team("Acme", "alice", "alice laptop")
    batch = await dashboard_server.admin("POST", "/admin/keys", name="batch", team_id=team,
                                         limits={"rpm": 60, "spend_budget": {"amount_micros": DOLLAR}})
    old = await dashboard_server.admin("POST", "/admin/keys", name="old", team_id=team,
                                       limits={"spend_budget": {"amount_micros": 2 * DOLLAR, "period": "day",
                                                                "hard": False}})
    await dashboard_server.admin("DELETE", f"/admin/keys/{old['id']}")
    # the big model: $3 a million prompt tokens; 390,000 of them are $1.17
    await dashboard_server.ledger.record(usage(team_id=team, key_id=batch["id"], model="big", time=time.time() - 60,
                                               prompt_tokens=390_000, completion_tokens=0, compute_tokens=0))
    await dashboard_server.ledger.flush(10)
    return {"team": team, "alice": alice, "batch": batch, "old": old}


async def sign_in(page, dashboard_server, key: str, path: str) -> None:
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", key)
    await page.click("button[type=submit]")
    await page.wait_for_url("**/dashboard/**")
    await page.goto(f"{dashboard_server.url}{path}")


async def api_status(dashboard_server, key: str) -> int:
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        return (await client.get("/v1/usage", headers={"authorization": f"Bearer {key}"})).status_code


@pytest.mark.parametrize("who", ["owner", "admin"])
async def test_keys_with_a_money_budget_are_listed_with_its_spend(dashboard_server, budgeted, page, artifacts, who):
    key, path = ((budgeted["alice"]["key"], f"/dashboard/keys?team_id={budgeted['team']}") if who == "owner"
                 else (ADMIN_KEY, "/dashboard/keys"))
    await sign_in(page, dashboard_server, key, path)
    assert await page.locator("#error-message").count() == 0, await page.content()
    limits = await page.inner_text(f"tr[data-key-id='{budgeted['batch']['id']}'] [data-limits]")
    assert "rpm 60" in limits and "$1.00 a month, hard" in limits, limits
    assert re.search(r"\$1\.17 spent \(117 ?%\)", limits), limits
    old = await page.inner_text(f"tr[data-key-id='{budgeted['old']['id']}'] [data-limits]")
    assert "$2.00 a day, alerts only" in old, old
    await page.screenshot(path=artifacts / f"keys-budgets-{who}.png", full_page=True)


async def test_rotating_a_budgeted_key_without_grace_shows_the_new_key(dashboard_server, budgeted, page):
    batch = budgeted["batch"]
    await sign_in(page, dashboard_server, budgeted["alice"]["key"], f"/dashboard/keys?team_id={budgeted['team']}")
    row = page.locator(f"tr[data-key-id='{batch['id']}']")
    await row.locator("input[name=grace_seconds]").fill("0")
    await row.locator("[data-action=rotate]").click()
    await page.click("#confirm-action")
    await page.wait_for_selector("#new-key")
    rotated = (await page.inner_text("#new-key")).strip()
    assert await api_status(dashboard_server, rotated) == 200
    assert await api_status(dashboard_server, batch["key"]) == 401
    # the successor keeps the budget, and the list under the new key shows it
    assert "$1.00 a month, hard" in await page.inner_text(f"tr[data-key-id='{rotated.split('-')[2]}'] [data-limits]")


async def test_creating_a_key_in_a_team_with_a_budgeted_key_shows_the_new_key(dashboard_server, budgeted, page):
    await sign_in(page, dashboard_server, budgeted["alice"]["key"], f"/dashboard/keys?team_id={budgeted['team']}")
    await page.fill("#key-name", "nightly")
    await page.click("#create-key")
    await page.wait_for_selector("#new-key")
    assert await api_status(dashboard_server, (await page.inner_text("#new-key")).strip()) == 200
