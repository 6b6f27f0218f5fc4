"""The 90-day view by hour in Chromium: 2,160 hours. The charts get at most one point per pixel column (3-hour
steps here, saying so); the tables under them list the latest week of them (saying so, with the CSV for the
rest); the chart data is as precise as a chart can show. A team with a 400,000-record quarter (its rollups written
directly: the page reads only those) gets its percentiles from the hourly histograms (saying so) and a page under
1 MB that draws every chart."""

from __future__ import annotations

import random
import time

import httpx
import pytest

from billing.store.latency_rollup import BUCKETS, upsert
from billing.store.rollups import DAILY, DAILY_KEY, DAILY_SUMS, HOURLY, HOURLY_KEY, HOURLY_SUMS, upsert_sql
from tests.billing.factory import usage
from tests.gateway.dashboard.test_dashboard_details import signed_in

pytestmark = pytest.mark.slow
DAY, HOUR = 86400, 3600
MAX_BYTES = 1_000_000


async def _load(dashboard_server, page, key: str, team: str) -> tuple[bytes, int]:
    """The page's HTML as sent, and the points the requests chart drew, in Chromium."""
    view = {"team_id": team, "range": "90d", "granularity": "hour"}
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=120) as client:
        await signed_in(client, key)
        html = (await client.get("/dashboard/overview", params=view)).content
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", key)
    await page.click("button[type=submit]")
    await page.goto(f"{dashboard_server.url}/dashboard/overview?team_id={team}&range=90d&granularity=hour",
                    timeout=120_000)
    await page.wait_for_function(
        "[...document.querySelectorAll('[data-chart]')].every(chart => chart.plot && chart.querySelector('canvas'))",
        timeout=120_000)
    return html, await page.eval_on_selector("[data-chart=requests]", "box => box.plot.data[0].length")


async def test_the_90_day_hourly_view_draws_a_point_per_pixel_column(dashboard_server, page, artifacts):
    team, _, owner = await dashboard_server.owned_team("Long", "lou", "lou's")
    rnd, now = random.Random(7), time.time()
    for _ in range(600):
        await dashboard_server.ledger.record(usage(
            team_id=team, key_id=owner["id"], model=rnd.choice(["small", "big"]), time=now - rnd.random() * 89 * DAY,
            latency_ms=rnd.random() * 900, ttft_ms=rnd.random() * 90, prompt_tokens=rnd.randint(10, 900)))
    await dashboard_server.ledger.flush(10)
    html, drawn = await _load(dashboard_server, page, owner["key"], team)
    elements = html.count(b"<") - html.count(b"</")
    assert len(html) < MAX_BYTES and elements < 20_000, (len(html), elements)
    assert 720 <= drawn <= 1_001  # 3-hour points (and the step's closing point), never one per hour
    assert "is 3 hours" in await page.inner_text("#chart-step")
    assert await page.locator("#percentiles-approximate").count() == 0  # 600 records: exact
    assert "latest 56 of the" in await page.inner_text("#tables-trimmed")  # a week of 3-hour steps
    assert await page.locator("table[data-series] tbody tr").count() == 56
    await page.screenshot(path=artifacts / "overview-90d-hourly.png")


async def test_a_400k_record_quarter_by_the_hour_stays_under_a_megabyte(dashboard_server, page, artifacts):
    team, _, owner = await dashboard_server.owned_team("Huge", "hugo", "hugo's")
    await _write_rollups(dashboard_server.ledger.store, team, owner["id"], time.time())
    html, drawn = await _load(dashboard_server, page, owner["key"], team)
    assert len(html) < MAX_BYTES, len(html)
    assert 720 <= drawn <= 1_001
    assert "within 4.9" in await page.inner_text("#percentiles-approximate")
    latency = await page.inner_text("[data-tile=latency]")
    assert latency.count("ms") == 3 and "–" not in latency
    requests = int(await page.get_attribute("[data-tile=requests] [data-n]", "data-n"))
    assert requests > 390_000
    await page.screenshot(path=artifacts / "overview-90d-hourly-400k.png")


async def _write_rollups(store, team: str, key_id: str, now: float) -> None:
    """The rollup rows a 400,000-record quarter of two models leaves (~93 requests per model and hour), written
    as the writer's upserts would leave them."""
    rnd = random.Random(11)
    first = int(now // DAY - 91) * DAY
    hourly, daily, latency = [], {}, []
    for hour in range(first, int(now), HOUR):
        for model in ("small", "big"):
            n = rnd.randint(80, 105)
            prompt, completion = n * 900, n * 300
            cost = prompt * 100_000 // 1_000_000 + completion * 400_000 // 1_000_000
            hourly.append((team, hour, model, n, prompt, completion, completion, cost, 0, 0, 0, 0, 0, 0, 0, 0, 0.0,
                           0.0))
            day = daily.setdefault((team, hour // DAY * DAY, model), [0, 0, 0, 0])
            for i, v in enumerate((n, prompt, completion, cost)):
                day[i] += v
            counts = [0] * (2 * BUCKETS)
            for _ in range(n):
                counts[min(BUCKETS - 1, 60 + int(rnd.gauss(10, 4)))] += 1
                counts[BUCKETS + min(BUCKETS - 1, 40 + int(rnd.gauss(8, 3)))] += 1
            latency.append((team, hour, model, completion, n * 500.0, *counts))
    daily_rows = [(t, d, m, key_id, "", "openai", "ok", 0, "", 100_000, 400_000, 100_000, 0, 0,
                   n, p, c, c, c, cost, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0) for (t, d, m), (n, p, c, cost) in daily.items()]
    async with store._db.transaction() as tx:  # rows no store method writes but the ledger's own insert
        await tx.executemany(upsert_sql(store.dialect, DAILY, DAILY_KEY, DAILY_SUMS), daily_rows)
        await tx.executemany(upsert_sql(store.dialect, HOURLY, HOURLY_KEY, HOURLY_SUMS), hourly)
        await tx.executemany(upsert(store.dialect), latency)
