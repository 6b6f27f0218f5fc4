"""The dashboard on a phone (390 px wide, Chromium): a request's detail reads as label over value, every value on
a line of its own width (not a character a line), nothing wider than the screen."""

from __future__ import annotations

import pytest

from tests.gateway.dashboard.browser import chromium_page
from tests.gateway.dashboard.test_dashboard_request_detail import ID, two_teams  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True, "has_touch": True}


async def test_a_requests_detail_reads_on_a_phone(dashboard_server, two_teams, artifacts):  # noqa: F811
    async with chromium_page(**PHONE) as page:
        await page.goto(f"{dashboard_server.url}/dashboard/login")
        await page.fill("#api_key", two_teams["key"]["key"])
        await page.click("button[type=submit]")
        await page.goto(f"{dashboard_server.url}/dashboard/requests/{ID}?team_id={two_teams['a']}")
        await page.wait_for_selector("#request-detail")
        await page.screenshot(path=artifacts / "request-detail-phone.png", full_page=True)
        widths = await page.eval_on_selector_all("dl.detail dd", "dds => dds.map(d => d.getBoundingClientRect().width)")
        assert min(widths) > 250, widths  # a value has the screen's width, not one character's
        size, model = await page.eval_on_selector(
            "[data-field=model]", "d => [parseFloat(getComputedStyle(d).fontSize), d.getBoundingClientRect().height]")
        assert model < 2 * size, (model, size)  # "small" on one line
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390


async def test_the_overviews_tables_show_cost_on_a_phone(dashboard_server, two_teams, artifacts):  # noqa: F811
    """Each row of a breakdown becomes a card of labelled lines: Cost is on the screen, not scrolled off it."""
    async with chromium_page(**PHONE) as page:
        await page.goto(f"{dashboard_server.url}/dashboard/login")
        await page.fill("#api_key", two_teams["key"]["key"])
        await page.click("button[type=submit]")
        await page.wait_for_selector("[data-breakdown=model]")
        for table in ("[data-breakdown=model]", "[data-breakdown=key]", "[data-series=time]"):
            column = await page.eval_on_selector(  # the Cost column, by its header
                table, "t => [...t.tHead.rows[0].cells].findIndex(c => c.innerText.trim() === 'Cost')")
            cell = page.locator(f"{table} tbody tr").first.locator("th, td").nth(column)
            box = await cell.bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= 390, (table, box)
            assert "$" in await cell.inner_text()
        await page.locator("[data-breakdown=model]").screenshot(path=artifacts / "overview-by-model-phone.png")
