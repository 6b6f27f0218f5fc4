"""The tables fit in Chromium: at 1440x900 the requests table (long names, an error outcome, a request id)
and the keys table (a key with an expiry) stay inside their box with every column and the Actions visible;
on a phone every row reflows into labelled lines; scroll regions take the keyboard's focus."""

from __future__ import annotations

import time

import pytest

from tests.billing.factory import usage
from tests.gateway.dashboard.browser import chromium_page

pytestmark = pytest.mark.slow
DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 375, "height": 812}


async def seed(dashboard_server) -> tuple[str, str]:
    team, user, key = await dashboard_server.owned_team("Wide", "a-user-with-a-rather-long-display-name",
                                                        "production batch summariser (eu-west-1)")
    await dashboard_server.admin("POST", "/admin/keys", name="expiring nightly export key", team_id=team,
                                 expires_at="2030-01-31T23:59:59Z")
    now = time.time()
    for i in range(3):
        await dashboard_server.ledger.record(usage(team_id=team, key_id=key["id"], user_id=user, time=now - 60 * i,
                                                   model="HuggingFaceTB/SmolLM2-135M-Instruct", latency_ms=12345.0,
                                                   status="error", error_code="upstream_failed", error_status=502))
    await dashboard_server.ledger.flush(10)
    return team, key["key"]


async def sign_in(page, dashboard_server, key: str) -> None:
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", key)
    await page.click("button[type=submit]")
    await page.wait_for_url("**/dashboard/overview**")


async def overflow(page, table: str) -> list[float]:
    """[table's scroll width - its box's width, the rightmost cell's right edge - the viewport's width]."""
    return await page.eval_on_selector(table, """t => {
        const box = t.parentElement;
        const right = Math.max(...[...t.querySelectorAll('td, th')].map(c => c.getBoundingClientRect().right));
        return [t.scrollWidth - box.clientWidth, right - document.documentElement.clientWidth];
    }""")


async def test_tables_fit_a_desktop_window(dashboard_server, artifacts):
    team, key = await seed(dashboard_server)
    async with chromium_page(viewport=DESKTOP) as page:
        await sign_in(page, dashboard_server, key)
        await page.goto(f"{dashboard_server.url}/dashboard/requests?team_id={team}")
        wider, beyond = await overflow(page, "table[data-requests]")
        assert wider <= 0 and beyond <= 0, (wider, beyond)
        await page.screenshot(path=artifacts / "requests-1440.png", full_page=True)
        await page.goto(f"{dashboard_server.url}/dashboard/keys?team_id={team}")
        wider, beyond = await overflow(page, "table[data-keys]")
        assert wider <= 0 and beyond <= 0, (wider, beyond)
        row = page.locator("tr", has_text="expiring nightly export key")
        for action in ("rotate", "revoke"):
            button = await row.locator(f"[data-action={action}]").bounding_box()
            assert button is not None and button["x"] + button["width"] <= DESKTOP["width"], action
        await page.screenshot(path=artifacts / "keys-1440.png", full_page=True)


async def test_rows_reflow_on_a_phone_and_scroll_regions_take_focus(dashboard_server, artifacts):
    team, key = await seed(dashboard_server)
    async with chromium_page(viewport=PHONE) as page:
        await sign_in(page, dashboard_server, key)
        await page.goto(f"{dashboard_server.url}/dashboard/requests?team_id={team}")
        cells = await page.eval_on_selector("table[data-requests] tbody tr", """row => [...row.cells].map(c => [
            getComputedStyle(c, '::before').content, c.getBoundingClientRect().right])""")
        assert [label for label, _ in cells] == ['"Time"', '"Key"', '"User"', '"End user, tags"', '"Model"',
                                                 '"Dialect"', '"Prompt"', '"Completion"', '"Cost"', '"Latency"',
                                                 '"Outcome"', '"Request id"']
        assert all(right <= PHONE["width"] for _, right in cells), cells
        await page.screenshot(path=artifacts / "requests-phone.png", full_page=True)
        await page.goto(f"{dashboard_server.url}/dashboard/keys?team_id={team}")
        actions = await page.locator("tr", has_text="expiring nightly").locator("[data-action=revoke]").bounding_box()
        assert actions is not None and actions["x"] + actions["width"] <= PHONE["width"]
        await page.screenshot(path=artifacts / "keys-phone.png", full_page=True)
        regions = await page.eval_on_selector_all(".breakdown", "boxes => boxes.map(b => b.tabIndex)")
        assert regions and all(index == 0 for index in regions)
