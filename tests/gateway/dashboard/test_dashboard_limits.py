"""The Limits page in Chromium: a member reaches it from the bar and reads the team's budget in money (spend,
thresholds reached, reset) and rate limits; its tables fit a desktop window and reflow on a phone."""

from __future__ import annotations

import time

from billing.records import UsageRecord
from tests.gateway.dashboard.browser import chromium_page
from tests.gateway.dashboard.test_dashboard_tables import sign_in


async def beyond_the_box(page, table: str) -> float:
    """How far the table's body cells reach past its box or the viewport (on a phone the header row is
    visually hidden and the rows are cards)."""
    return await page.eval_on_selector(table, """t => {
        const cells = [...t.querySelectorAll('tbody td, tbody th')];
        const right = Math.max(...cells.map(c => c.getBoundingClientRect().right));
        return Math.max(t.scrollWidth - t.parentElement.clientWidth,
                        right - Math.min(document.documentElement.clientWidth,
                                         t.parentElement.getBoundingClientRect().right));
    }""")


DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 375, "height": 812}


async def test_a_member_reads_the_teams_limits_and_budget(dashboard_server, artifacts):
    team = (await dashboard_server.admin("POST", "/admin/teams", name="Budgeted", limits={
        "rpm": 600, "tpm": 100000, "spend_budget": {"amount_micros": 1600, "period": "day"}}))["id"]
    user = (await dashboard_server.admin("POST", "/admin/users", name="mina"))["id"]
    await dashboard_server.admin("PUT", f"/admin/teams/{team}/members/{user}", role="member")
    key = await dashboard_server.admin("POST", "/admin/keys", name="mina's", team_id=team, user_id=user)
    # 4,000 prompt tokens of `small` at 100,000 micro-units a million, 1,000 output at 400,000: 400 + 400 micros
    await dashboard_server.ledger.record(UsageRecord(
        "limits-1", time.time() - 5, team, key["id"], user, "small", "openai", "/v1/completions", 4000, 1000,
        1000, "ok", 10.0, 2.0, "w"))
    await dashboard_server.ledger.flush(10)
    for name, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        async with chromium_page(viewport=viewport) as page:
            await sign_in(page, dashboard_server, key["key"])
            await page.click("nav >> text=Limits")
            await page.wait_for_url("**/dashboard/limits**")
            row = page.locator(f'tr[data-scope="team:{team}"]').first
            assert await row.locator("[data-label=Spent]").get_attribute("data-micros") == "800"
            assert await row.locator("[data-label='Alerts reached']").get_attribute("data-thresholds") == "50"
            assert "T00:00:00Z" in await row.locator("[data-label=Resets]").inner_text()
            rates = page.locator(f'table[data-limits=rates] tr[data-scope="team:{team}"]')
            assert "600" in await rates.locator("[data-label='Requests / min']").inner_text()
            await page.screenshot(path=artifacts / f"limits-{name}.png", full_page=True)
            for table in ("table[data-limits=budgets]", "table[data-limits=rates]"):
                assert await beyond_the_box(page, table) <= 0, (name, table)
