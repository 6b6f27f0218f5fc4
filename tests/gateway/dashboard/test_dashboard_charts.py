"""The overview's charts in Chromium: a stacked chart's legend reads each model's own amount (never a
running total), every y axis starts at 0 and writes a million compactly, times read as the tables write
them, an empty view says so on the chart, and the speed charts' line per model reads that model's own
percentile under the pointer."""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime

import pytest

from tests.billing.factory import usage

pytestmark = pytest.mark.slow
HOUR = 3600.0


def number(shown: str) -> float:
    """The number of a legend value as written ("1,234 ms", "12.3 tok/s", "2,102,505 tokens")."""
    return float(re.sub(r"[^0-9.\-]", "", shown))


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
            own = int(number(shown[model]))
            assert shown[model].endswith(" tokens"), shown
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


# Per (days ago, model): latencies (ms) of its requests; each with a first token at a tenth of it.
LATENCIES = {(0, "small"): [100.0, 200.0, 300.0, 400.0, 2000.0], (0, "big"): [1500.0, 3000.0, 4500.0],
             (2, "small"): [600.0], (2, "big"): [2500.0, 3500.0, 3900.0]}


def tokens_of(latency: float) -> int:
    return round(latency * 0.9 / 100)


def nearest_rank(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)), 1) - 1]


async def hover(page, chart: str, idx: int, label: str) -> None:
    """Move the pointer onto the line `label` of `chart` in bucket `idx`."""
    await page.locator(f"[data-chart={chart}]").scroll_into_view_if_needed()
    x, y = await page.eval_on_selector(f"[data-chart={chart}]", """(box, [idx, label]) => {
        const plot = box.plot;
        const line = plot.series.findIndex(s => s.label === label);
        const over = box.querySelector('.u-over').getBoundingClientRect();
        const [x, y] = [plot.valToPos(plot.data[0][idx], 'x'), plot.valToPos(plot.data[line][idx], 'y')];
        return [over.left + x + 4, over.top + y];
    }""", [idx, label])
    await page.mouse.move(0, 0)
    await page.mouse.move(x, y)
    await page.evaluate("() => new Promise(done => requestAnimationFrame(() => done()))")


async def legend_rows(page, chart: str) -> dict[str, tuple[str, str]]:
    """label -> (value, opacity) of the legend's lines."""
    rows = await page.eval_on_selector_all(
        f"[data-chart={chart}] .u-legend .u-series",
        "rows => rows.slice(1).map(r => [r.querySelector('.u-label').innerText, r.querySelector('.u-value').innerText,"
        " r.style.opacity || '1'])")
    return {label: (value, opacity) for label, value, opacity in rows}


async def test_hovering_a_models_line_shows_that_models_own_value(dashboard_server, page, artifacts):
    """Latency and time to first token draw one line per model for the chosen percentile (and all models
    together, dashed); output tokens per second one per model. The line under the pointer is brought forward and
    the legend reads each model's own value, equal to a direct computation over its records."""
    team = (await dashboard_server.admin("POST", "/admin/teams", name="Per model"))["id"]
    key = await dashboard_server.admin("POST", "/admin/keys", name="per-model", team_id=team)
    now = time.time()
    for (days, model), latencies in LATENCIES.items():
        for i, latency in enumerate(latencies):
            await dashboard_server.ledger.record(usage(
                team_id=team, key_id=key["id"], model=model, time=now - days * 24 * HOUR - 60 - i,
                latency_ms=latency, ttft_ms=latency / 10, completion_tokens=tokens_of(latency)))
    await dashboard_server.ledger.flush(10)
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", key["key"])
    await page.click("button[type=submit]")
    await page.wait_for_selector("[data-chart=latency] canvas")
    days = await page.eval_on_selector_all("table[data-series] tbody th", "cells => cells.map(c => c.innerText)")
    index = {days_ago: days.index(utc_day(now - days_ago * 24 * HOUR)) for days_ago in (0, 2)}
    checked = 0
    for chart, share in (("latency", 1.0), ("ttft", 0.1)):
        for percentile, fraction in (("p95", 0.95), ("p50", 0.5)):
            await page.select_option(f"#{chart}-percentile", percentile)
            for (days_ago, model), latencies in LATENCIES.items():
                await hover(page, chart, index[days_ago], model)
                rows = await legend_rows(page, chart)
                expected = nearest_rank([v * share for v in latencies], fraction)
                # rounded to the millisecond, with its unit, as the tables write it
                assert re.fullmatch(r"[\d,]+ ms", rows[model][0]), rows
                assert number(rows[model][0]) == pytest.approx(expected, abs=0.5), (chart, percentile, model)
                # the line under the pointer is brought forward (the all-models line where it runs on this one)
                (focused,) = [m for m, (_, opacity) in rows.items() if opacity == "1"]
                assert number(rows[focused][0]) == pytest.approx(expected, abs=0.5), rows
                together = [v * share for (d, _), values in LATENCIES.items() if d == days_ago for v in values]
                assert number(rows["all models"][0]) == pytest.approx(nearest_rank(together, fraction), abs=0.5)
                checked += 1
        if chart == "latency":
            await page.locator("section.chart:has([data-chart=latency])").screenshot(
                path=artifacts / "overview-per-model-latency.png")
    assert checked == 16
    for (days_ago, model), latencies in LATENCIES.items():
        await hover(page, "speed", index[days_ago], model)
        rows = await legend_rows(page, "speed")
        expected = sum(map(tokens_of, latencies)) * 1000 / sum(v * 0.9 for v in latencies)
        assert re.fullmatch(r"[\d,]+\.\d tok/s", rows[model][0]), rows  # to a tenth, with its unit
        assert number(rows[model][0]) == pytest.approx(expected, abs=0.05), (days_ago, model, rows)
    # the numbers of the per-model lines are also in a table
    cells = await page.eval_on_selector_all(
        "table[data-model-timings] tbody tr", "rows => rows.map(r => [r.dataset.model, r.cells[3].innerText])")
    expected = [(model, f"{nearest_rank(v, 0.95):,.0f} ms") for (_, model), v in LATENCIES.items()]
    assert sorted(map(tuple, cells)) == sorted(expected)


async def test_the_charts_follow_the_windows_width(dashboard_server, page, artifacts):
    key, _ = await seed(dashboard_server)
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", key)
    await page.click("button[type=submit]")
    await page.wait_for_selector("[data-chart=tokens] canvas")

    async def widths() -> tuple[float, float]:
        return await page.eval_on_selector("[data-chart=tokens]", "box => [box.plot.width, box.clientWidth]")

    wide, box = await widths()
    assert wide == pytest.approx(box - 8, abs=2)
    await page.set_viewport_size({"width": 700, "height": 900})
    await page.wait_for_function("() => { const b = document.querySelector('[data-chart=tokens]');"
                                 " return Math.abs(b.plot.width - (b.clientWidth - 8)) <= 2; }")
    narrow, box = await widths()
    assert narrow < wide and narrow <= box
    await page.set_viewport_size({"width": 1280, "height": 900})
    await page.wait_for_function(f"() => document.querySelector('[data-chart=tokens]').plot.width > {narrow + 100}")
    # the cost legend in dollars, rounded to the cent
    await page.focus("[data-chart=cost]")
    await page.keyboard.press("End")
    values = [v for _, v in (await legend(page, "cost"))[1:]]
    assert values and all(re.fullmatch(r"\$[\d,]+\.\d\d|\$0\.0+\d{1,2}", v) for v in values), values


async def test_model_names_nobody_serves_are_one_group(dashboard_server, page):
    """Requests refused for a model name no endpoint serves (typos, another provider's names) ran no token: they
    are one group of the charts, not a line each; a model that ran (here `big`, not served now) keeps its own."""
    key, _ = await seed(dashboard_server)
    team = (await dashboard_server.admin("GET", "/admin/keys?limit=200"))["data"]
    charts = next(k for k in team if k["name"] == "charts")
    for name in ("gpt-4o-typo", "claude-nope", "gpt-4o-typo"):
        await dashboard_server.ledger.record(usage(
            team_id=charts["team_id"], key_id=charts["id"], model=name, time=time.time() - 120, status="rejected",
            prompt_tokens=0, completion_tokens=0, compute_tokens=0, error_code="model_not_found", error_status=404,
            ttft_ms=None))
    await dashboard_server.ledger.flush(10)
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", key)
    await page.click("button[type=submit]")
    await page.wait_for_selector("[data-chart=requests] canvas")
    labels = await page.eval_on_selector("[data-chart=requests]", "b => b.plot.series.slice(1).map(s => s.label)")
    assert sorted(labels) == ["big", "models nobody serves (2 names)", "small"], labels
    data = await page.eval_on_selector("[data-chart-data]", "s => JSON.parse(s.textContent)")
    folded = next(line for line in data["requests"] if line["label"].startswith("models nobody serves"))
    assert sum(folded["values"]) == 3
    speed = [line["label"] for line in data["speed"]]
    assert "gpt-4o-typo" not in speed and "claude-nope" not in speed
    # the table of models still names each (a filter finds them)
    assert "gpt-4o-typo" in await page.inner_text("table[data-breakdown=model]")
