"""Every dashboard page (its error states included) passes axe-core (vendored, testkit/vendor/axe-core) in
Chromium with no violation, at desktop and phone size, signed out and signed in as a team owner and as the admin."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.billing.factory import usage
from tests.gateway.dashboard.browser import chromium_page
from tests.gateway.dashboard.served import ADMIN_KEY

pytestmark = pytest.mark.slow
AXE = Path(__file__).parents[3] / "testkit" / "vendor" / "axe-core" / "axe.min.js"
SIZES = {"desktop": {"width": 1440, "height": 900}, "phone": {"width": 375, "height": 812}}
SIGNED_OUT = ["/dashboard/login"]
SIGNED_IN = ["/dashboard/overview", "/dashboard/overview?range=custom&start=2026-01-01&end=2025-01-01",
             "/dashboard/overview?granularity=week&group_by=key", "/dashboard/requests", "/dashboard/keys",
             "/dashboard/keys/{service_key}/edit", "/dashboard/teams", "/dashboard/request",
             "/dashboard/request?id=req-nobody-has-this", "/dashboard/requests/req-accessible-0",
             "/dashboard/members", "/dashboard/audit", "/dashboard/limits"]


async def seed(dashboard_server) -> tuple[str, str, str]:
    """A team with budgets, an owner's key, keys of every state and a day of traffic on two models (errors too)."""
    team = (await dashboard_server.admin("POST", "/admin/teams", name="Accessible", limits={
        "monthly_token_budget": 5000, "spend_budget": {"amount_micros": 2000, "period": "day"}}))["id"]
    user = (await dashboard_server.admin("POST", "/admin/users", name="owner"))["id"]
    await dashboard_server.admin("PUT", f"/admin/teams/{team}/members/{user}", role="owner")
    key = await dashboard_server.admin("POST", "/admin/keys", name="owner's key", team_id=team, user_id=user)
    service = await dashboard_server.admin("POST", "/admin/keys", name="expiring", team_id=team,
                                  expires_at="2030-01-31T23:59:59Z")
    now = time.time()
    for i in range(24):
        await dashboard_server.ledger.record(usage(team_id=team, key_id=key["id"], user_id=user, time=now - 3600 * i,
                                          request_id=f"req-accessible-{i}",
                                          model="small" if i % 2 else "big",
                                          **({"status": "error", "error_code": "upstream_failed",
                                              "error_status": 502} if i % 5 == 0 else {})))
    await dashboard_server.ledger.flush(10)
    return team, key["key"], service["id"]


async def violations(page) -> list[str]:
    """axe's violations on the page as it is, one line each: rule, impact, the first offending nodes."""
    if not await page.evaluate("() => typeof axe !== 'undefined'"):
        await page.evaluate(AXE.read_text())  # through the debugger, not a <script>: the page's CSP stays on
    found = await page.evaluate("""async () => (await axe.run(document)).violations.map(v =>
        `${v.id} (${v.impact}): ${v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(', ')}`)""")
    return [f"{page.url}: {line}" for line in found]


async def sign_in(page, dashboard_server, key: str) -> None:
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", key)
    await page.click("button[type=submit]")
    await page.wait_for_url("**/dashboard/**")


@pytest.mark.parametrize("size", SIZES)
async def test_every_page_has_no_axe_violation(dashboard_server, size):
    team, key, service_key = await seed(dashboard_server)
    found: list[str] = []
    async with chromium_page(viewport=SIZES[size], color_scheme="light") as page:
        for path in SIGNED_OUT:
            await page.goto(dashboard_server.url + path)
            found += await violations(page)
        for signed_in_as in (key, ADMIN_KEY):
            await sign_in(page, dashboard_server, signed_in_as)
            for path in SIGNED_IN:
                joiner = "&" if "?" in path else "?"
                await page.goto(f"{dashboard_server.url}{path.format(service_key=service_key)}{joiner}team_id={team}")
                found += await violations(page)
            await page.goto(f"{dashboard_server.url}/dashboard/overview?team_id={team}")
            await page.click("form[action$='/logout'] button")
    assert found == [], "\n".join(found)


async def test_dark_mode_has_no_axe_violation(dashboard_server):
    team, key, service_key = await seed(dashboard_server)
    async with chromium_page(viewport=SIZES["desktop"], color_scheme="dark") as page:
        await sign_in(page, dashboard_server, key)
        found: list[str] = []
        for path in SIGNED_IN:
            joiner = "&" if "?" in path else "?"
            await page.goto(f"{dashboard_server.url}{path.format(service_key=service_key)}{joiner}team_id={team}")
            found += await violations(page)
    assert found == [], "\n".join(found)
