"""The overview's charts in Chromium: a stacked chart's legend reads each model's own amount (never a
running total), every y axis starts at 0 and writes a million compactly, times read as the tables write
them, and an empty view says so on the chart."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from tests.billing.factory import usage

pytestmark = pytest.mark.slow
HOUR = 3600.0


def utc_day(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d")


async def seed(dashboard_server) -> tuple[str, dict[tuple[str, str], int]]:
    """One team: `small` has a two-million-token hour today, `big` a smaller one two days ago (so on each day
    one of the two models has nothing). Returns a key and each (UTC day, model)'s tokens."""
    team = (await dashboard_server.admin("POST", "/admin/teams", name="Charts"))["id"]
    key = await dashboard_server.admin("POST", "/admin/keys", name="charts", team_id=team)
    now = time.time()
    records = [usage(team_id=team, key_id=key["id"], model="small", time=now - HOUR, prompt_tokens=2_000_000,
                     completion_tokens=102_505, compute_tokens=102_505),
               usage(team_id=team, key_id=key["id"], model="big", time=now - 2 * 24 * HOUR, prompt_tokens=990_000,
                     completion_tokens=4_200, compute_tokens=4_200)]
    for record in records:
        await dashboard_server.ledger.record(record)
    await dashboard_server.ledger.flush(10)
    return key["key"], {(utc_day(now - HOUR), "small"): 2_102_505, (utc_day(now - 2 * 24 * HOUR), "big"): 994_200}


async def legend(page, chart: str) -> list[tuple[str, str]]:
    """The legend's (label, value) rows: the time first, then one per line."""
    return await page.eval_on_selector_all(
        f"[data-chart={chart}] .u-legend .u-series",
        "rows => rows.map(r => [r.querySelector('.u-label').innerText, r.querySelector('.u-value').innerText])")


async def test_a_stacked_legend_reads_each_models_own_amount(dashboard_server, page, artifacts):
    key, expected = await seed(dashboard_server)
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", key)
    await page.click("button[type=submit]")
    await page.wait_for_selector("[data-chart=tokens] canvas")
    days = await page.eval_on_selector_all("table[data-series] tbody th", "cells => cells.map(c => c.innerText)")
    await page.focus("[data-chart=tokens]")
    await page.keyboard.press("Home")
    checked = 0
    for day in days:
        (_, when), *lines = await legend(page, "tokens")
        assert when == f"{day} 00:00"  # as the table under the chart writes the day
        shown = dict(lines)
        for model in ("small", "big"):
            own = int(shown[model].replace(",", ""))
            assert own == expected.get((day, model), 0), (day, model, shown)  # a quiet model shows 0
            checked += own > 0
        await page.keyboard.press("ArrowRight")
    assert checked == 2
    await page.screenshot(path=artifacts / "overview-charts.png", full_page=True)

    # every y axis starts at 0 (the cost one included) and a tick of millions is written compactly
    for chart in ("tokens", "cost", "events", "waits"):
        low, labels = await page.eval_on_selector(f"[data-chart={chart}]", """box => {
            const plot = box.plot;
            return [plot.scales.y.min, plot.axes[1].values(plot, [0, 1500000, 2102505])];
        }""")
        assert low == 0, chart
        assert labels[1:] == ["1.5M", "2.1M"], (chart, labels)
    assert await page.query_selector("[data-chart=tokens] .chart-empty") is None


async def test_an_empty_view_says_so_on_each_chart(dashboard_server, page):
    team = (await dashboard_server.admin("POST", "/admin/teams", name="Quiet"))["id"]
    key = (await dashboard_server.admin("POST", "/admin/keys", name="quiet", team_id=team))["key"]
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", key)
    await page.click("button[type=submit]")
    await page.wait_for_selector("[data-chart=tokens] canvas")
    notes = await page.eval_on_selector_all("[data-chart] .chart-empty", "ps => ps.map(p => p.innerText)")
    charts = await page.eval_on_selector_all("[data-chart]", "boxes => boxes.length")
    assert notes == ["No data in this view."] * charts and charts == 9
    low, high = await page.eval_on_selector("[data-chart=tokens]",
                                            "box => [box.plot.scales.y.min, box.plot.scales.y.max]")
    assert (low, high) == (0, 1)  # an axis is still drawn, from 0
