"""The overview's trends in Chromium: latency, first-token and output-speed charts and their table equal the
records; failures by status; the series split by a chosen column, the user filter and week buckets kept
across Apply and links; the change from the previous period equals the usage API over that window; numbers
in the browser's locale; a bad new parameter is said at its field, another team's id is refused."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from tests.billing.factory import usage
from tests.gateway.dashboard.browser import chromium_page

pytestmark = pytest.mark.slow
DAY = 86400.0


def nearest_rank(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)), 1) - 1]


def params(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}


@pytest.fixture
async def team(dashboard_server) -> dict:
    """A team with a member's personal key and a service key. Today (UTC): 40 varied requests; 8 days ago
    (the previous 7 days): 10 requests; one failure of each of two statuses."""
    team = (await dashboard_server.admin("POST", "/admin/teams", name="Trends"))["id"]
    user = (await dashboard_server.admin("POST", "/admin/users", name="tess"))["id"]
    await dashboard_server.admin("PUT", f"/admin/teams/{team}/members/{user}", role="member")
    personal = await dashboard_server.admin("POST", "/admin/keys", name="tess's", team_id=team, user_id=user)
    service = await dashboard_server.admin("POST", "/admin/keys", name="batch", team_id=team)
    now = time.time()
    today = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    at = max(today + 60, now - 6 * 3600)  # inside today and inside the last 7 days
    records = []
    for i in range(40):
        key, user_id = (personal, user) if i % 3 else (service, None)
        records.append(usage(team_id=team, key_id=key["id"], user_id=user_id, time=at + i,
                             model="big" if i % 2 else "small", latency_ms=100.0 + 37 * i % 900,
                             ttft_ms=10.0 + 13 * i % 90, completion_tokens=20 + i, compute_tokens=20 + i,
                             prompt_tokens=1_234_567 if i == 0 else 100))
    records.append(usage(team_id=team, key_id=service["id"], time=at + 50, status="error", error_code="worker_failed",
                         error_status=502, latency_ms=5000.0, ttft_ms=None, completion_tokens=0, compute_tokens=0))
    records.append(usage(team_id=team, key_id=service["id"], time=at + 51, status="rejected", latency_ms=1.0,
                         ttft_ms=None, error_code="rate_limit_exceeded", error_status=429, prompt_tokens=0,
                         completion_tokens=0, compute_tokens=0))
    for i in range(10):
        records.append(usage(team_id=team, key_id=personal["id"], user_id=user, time=now - 8 * DAY + i))
    for record in records:
        await dashboard_server.ledger.record(record)
    await dashboard_server.ledger.flush(10)
    return {"id": team, "key": personal["key"], "service_key": service["key"], "service_id": service["id"],
            "records": records, "now": now}


async def sign_in(page, dashboard_server, key: str) -> None:
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", key)
    await page.click("button[type=submit]")
    await page.wait_for_selector("[data-chart=latency] canvas")


async def test_timing_charts_and_their_table_equal_the_records(dashboard_server, page, team, artifacts):
    await sign_in(page, dashboard_server, team["key"])
    await page.goto(f"{dashboard_server.url}/dashboard/overview?team_id={team['id']}&granularity=day")
    await page.wait_for_selector("[data-chart=speed] canvas")
    today = [r for r in team["records"] if r.time > team["now"] - 2 * DAY]
    reached = [r for r in today if r.status != "rejected"]
    label = datetime.fromtimestamp(today[0].time, UTC).date().isoformat()
    row = await page.eval_on_selector(
        f"table[data-timings] tbody tr:has(th:text-is('{label}'))",
        "tr => [...tr.querySelectorAll('td')].map(td => td.innerText)")
    latencies = [r.latency_ms for r in reached]
    ttfts = [r.ttft_ms for r in reached if r.ttft_ms is not None]
    expected = [f"{nearest_rank(v, f):,.0f} ms" for v in (latencies, ttfts) for f in (0.5, 0.95, 0.99)]
    assert row[:6] == expected
    streamed = [r for r in reached if r.status == "ok" and r.ttft_ms is not None and r.latency_ms > r.ttft_ms]
    speed = sum(r.completion_tokens for r in streamed) * 1000 / sum(r.latency_ms - r.ttft_ms for r in streamed)
    assert row[6] == f"{speed:,.1f}"
    assert row[7] == "429: 1, 502: 1"
    # the charts read the same numbers: the latency chart's last bucket (today) in its legend, p99 chosen: all
    # models together and each model's own
    await page.select_option("#latency-percentile", "p99")
    await page.focus("[data-chart=latency]")
    await page.keyboard.press("End")
    legend = dict(await page.eval_on_selector_all(
        "[data-chart=latency] .u-legend .u-series",
        "rows => rows.map(r => [r.querySelector('.u-label').innerText, r.querySelector('.u-value').innerText])"))
    assert legend["all models"] == f"{nearest_rank(latencies, 0.99):,.0f} ms", legend  # whole milliseconds
    models = {r.model for r in reached}
    assert len(models) == 2
    for model in models:
        own = [r.latency_ms for r in reached if r.model == model]
        assert legend[model] == f"{nearest_rank(own, 0.99):,.0f} ms", (model, legend)
    errors = await page.eval_on_selector("[data-chart=errors]", "box => box.plot.series.map(s => s.label)")
    assert sorted(errors[1:]) == ["429", "502"]
    requests = await page.eval_on_selector("[data-chart=requests]", "box => box.plot.series.map(s => s.label)")
    assert sorted(requests[1:]) == ["big", "small"]
    # the latency tile's p99 is the window's (today and nothing before it in 7 days)
    assert (await page.inner_text("[data-tile=latency]")).endswith(f"{nearest_rank(latencies, 0.99):,.0f} ms")
    await page.screenshot(path=artifacts / "overview-trends.png", full_page=True)


async def test_split_filter_and_week_buckets_are_controls_that_applies_and_links_keep(dashboard_server, page, team):
    await sign_in(page, dashboard_server, team["key"])
    users = await page.eval_on_selector_all("#user_id option", "os => os.map(o => [o.value, o.innerText])")
    assert dict(users)["-"] == "service keys (no user)" and "tess" in " ".join(t for _, t in users)
    await page.select_option("#group_by", "key")
    await page.select_option("#user_id", "-")
    await page.select_option("#granularity", "week")
    await page.select_option("#range", "30d")
    await page.click("#apply")
    await page.wait_for_url("**group_by=key**")
    kept = params(page.url)
    assert (kept["user_id"], kept["granularity"], kept["range"]) == ("-", "week", "30d")
    assert params(await page.get_attribute("nav >> text=Requests", "href"))["group_by"] == "key"
    await page.wait_for_selector("[data-chart=requests] canvas")
    split = await page.eval_on_selector("[data-chart=requests]", "box => box.plot.series.map(s => s.label)")
    assert split[1:] == [team["service_id"]]  # by key, and only the service key's requests (no user)
    labels = await page.eval_on_selector_all("table[data-series=time] tbody th", "ths => ths.map(t => t.innerText)")
    assert labels and all(datetime.fromisoformat(d).weekday() == 0 for d in labels)  # weeks start on Monday
    # the week table's requests are the service keys' own, as the usage API counts them
    shown = sum(await page.eval_on_selector_all(
        "table[data-series=time] tbody tr", "rows => rows.map(r => Number(r.cells[1].innerText.replaceAll(',', '')))"))
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        start = datetime.fromisoformat(labels[0]).replace(tzinfo=UTC)
        api = (await client.get("/v1/usage", params={"start": start.isoformat(), "group_by": "none",
                                                      "user_id": "-"},
                                headers={"authorization": f"Bearer {team['service_key']}"})).json()
    assert shown == api["totals"]["requests"] == sum(1 for r in team["records"] if r.user_id is None)
    await page.select_option("#range", "7d")  # the next Apply keeps them
    await page.click("#apply")
    await page.wait_for_url("**range=7d**")
    assert (params(page.url)["group_by"], params(page.url)["granularity"]) == ("key", "week")
    assert await page.input_value("#group_by") == "key" and await page.input_value("#user_id") == "-"


async def test_the_change_from_the_previous_period_equals_the_usage_api(dashboard_server, page, team):
    await sign_in(page, dashboard_server, team["key"])
    change = await page.get_attribute("[data-change=requests]", "data-previous")
    start = datetime.fromtimestamp(team["now"], UTC) - timedelta(days=14)
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        api = (await client.get("/v1/usage", params={"start": start.isoformat(),
                                                      "end": (start + timedelta(days=7)).isoformat(),
                                                      "group_by": "none"},
                                headers={"authorization": f"Bearer {team['key']}"})).json()
    assert int(change) == api["totals"]["requests"] == 10
    now = int((await page.inner_text("[data-tile=requests]")).replace(",", ""))
    assert now == 42
    # a share in the browser's locale (en-US: "+320.0%")
    assert (await page.inner_text("[data-change=requests]")).startswith(f"{(now - 10) / 10 * 100:+,.1f}%")


async def test_numbers_follow_the_browsers_locale(dashboard_server, team, artifacts):
    async with chromium_page(locale="de-DE") as page:
        await sign_in(page, dashboard_server, team["key"])
        prompt = sum(r.prompt_tokens for r in team["records"] if r.time > team["now"] - 7 * DAY)
        assert await page.inner_text("[data-tile=prompt_tokens]") == f"{prompt:,}".replace(",", ".")
        cost = await page.inner_text("[data-tile=cost]")
        assert cost.endswith("$") and "," in cost, cost  # "0,12 $"
        await page.screenshot(path=artifacts / "overview-de.png", full_page=True)


@pytest.mark.parametrize(("field", "value"), [("group_by", "colour"), ("granularity", "fortnight"),
                                               ("user_id", "x" * 300)])
async def test_a_bad_new_parameter_is_said_at_its_field(dashboard_server, page, team, field, value):
    await sign_in(page, dashboard_server, team["key"])
    answer = await page.goto(f"{dashboard_server.url}/dashboard/overview?team_id={team['id']}&{field}={value}")
    assert answer.status == 400
    assert field in await page.inner_text(f"#{field}-error")
    assert await page.query_selector("[data-tile]") is None


async def test_another_teams_id_is_refused_with_the_new_parameters(dashboard_server, page, team):
    other = (await dashboard_server.admin("POST", "/admin/teams", name="Elsewhere"))["id"]
    await sign_in(page, dashboard_server, team["key"])
    answer = await page.goto(f"{dashboard_server.url}/dashboard/overview?team_id={other}&group_by=user"
                             "&granularity=month&user_id=-")
    assert answer.status == 404
    assert await page.query_selector("[data-tile]") is None
