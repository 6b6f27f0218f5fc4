"""The 90-day view by hour in Chromium: 2,160 buckets. The charts draw every one; the tables under them list the
latest week of hours (saying so, with the CSV and the daily view for the rest), the chart data is as precise as a
chart can show, so the page stays under 1 MB of HTML and a few thousand elements instead of 6 MB and 200,000."""

from __future__ import annotations

import random
import time

import httpx
import pytest

from tests.billing.factory import usage
from tests.gateway.dashboard.test_dashboard_details import signed_in

pytestmark = pytest.mark.slow
DAY = 86400


async def test_the_90_day_hourly_view_stays_small_and_draws_every_hour(dashboard_server, page, artifacts):
    team, _, owner = await dashboard_server.owned_team("Long", "lou", "lou's")
    rnd, now = random.Random(7), time.time()
    for _ in range(600):
        await dashboard_server.ledger.record(usage(
            team_id=team, key_id=owner["id"], model=rnd.choice(["small", "big"]), time=now - rnd.random() * 89 * DAY,
            latency_ms=rnd.random() * 900, ttft_ms=rnd.random() * 90, prompt_tokens=rnd.randint(10, 900)))
    await dashboard_server.ledger.flush(10)
    view = {"team_id": team, "range": "90d", "granularity": "hour"}
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=60) as client:
        await signed_in(client, owner["key"])
        html = (await client.get("/dashboard/overview", params=view)).content
    elements = html.count(b"<") - html.count(b"</")
    assert len(html) < 1_000_000 and elements < 20_000, (len(html), elements)

    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", owner["key"])
    await page.click("button[type=submit]")
    await page.goto(f"{dashboard_server.url}/dashboard/overview?team_id={team}&range=90d&granularity=hour")
    await page.wait_for_selector("[data-chart=requests] canvas")
    drawn = await page.eval_on_selector("[data-chart=requests]", "box => box.plot.data[0].length")
    assert drawn >= 2160  # every hour of the 90 days (and the step's closing point)
    assert "latest 168 of the" in await page.inner_text("#tables-trimmed")
    assert await page.locator("table[data-series] tbody tr").count() == 168
    await page.screenshot(path=artifacts / "overview-90d-hourly.png")
