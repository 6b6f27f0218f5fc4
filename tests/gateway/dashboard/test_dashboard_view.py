"""The view (range, dates, zone) in Chromium: Apply reloads the page, so the header's links and the team
switcher carry the new view; From/To make the range custom; a refused zone or an end before the start is
said at its field, with the values as typed."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

from tests.billing.factory import usage
from tests.gateway.dashboard.served import ADMIN_KEY

pytestmark = pytest.mark.slow


async def sign_in(page, dashboard_server) -> tuple[str, str]:
    """The admin signed in; two teams to switch between."""
    first = (await dashboard_server.admin("POST", "/admin/teams", name="First"))["id"]
    second = (await dashboard_server.admin("POST", "/admin/teams", name="Second"))["id"]
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", ADMIN_KEY)
    await page.click("button[type=submit]")
    await page.goto(f"{dashboard_server.url}/dashboard/overview?team_id={first}")
    return first, second


def params(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}


async def test_links_and_the_team_switcher_carry_the_applied_view(dashboard_server, page):
    first, second = await sign_in(page, dashboard_server)
    await page.select_option("#range", "30d")
    await page.fill("#tz", "Asia/Tokyo")
    await page.click("#apply")
    await page.wait_for_url("**range=30d**")
    for link in ("Overview", "Requests"):
        href = await page.get_attribute(f"nav >> text={link}", "href")
        assert params(href)["range"] == "30d" and params(href)["tz"] == "Asia/Tokyo", href
    await page.select_option("#team-switch", second)
    await page.wait_for_url(f"**team_id={second}**")
    assert params(page.url)["range"] == "30d" and params(page.url)["tz"] == "Asia/Tokyo"
    await page.click("nav >> text=Requests")
    await page.wait_for_url("**/dashboard/requests**")
    assert params(page.url) | {"team_id": second} == params(page.url) and params(page.url)["range"] == "30d"
    assert "Asia/Tokyo" in await page.inner_text("h1 small")


async def test_from_and_to_make_the_range_custom(dashboard_server, page):
    await sign_in(page, dashboard_server)
    assert await page.input_value("#range") == "7d"
    await page.fill("#start", "2026-01-05")
    await page.dispatch_event("#start", "change")
    assert await page.input_value("#range") == "custom"
    await page.click("#apply")
    await page.wait_for_url("**start=2026-01-05**")
    assert params(page.url)["range"] == "custom"
    assert (await page.inner_text("h1 small")).startswith("2026-01-05 00:00")
    # a named range again clears the dates, which would otherwise be ignored
    await page.select_option("#range", "24h")
    assert await page.input_value("#start") == ""


@pytest.mark.parametrize(("field", "typed", "words"), [("tz", "Mars/Olympus_Mons", "tz"),
                                                        ("end", "2026-01-01", "before start")])
async def test_a_refused_value_is_said_at_its_field(dashboard_server, page, field, typed, words):
    await sign_in(page, dashboard_server)
    if field == "end":
        await page.fill("#start", "2026-02-01")
    await page.fill(f"#{field}", typed)
    await page.dispatch_event(f"#{field}", "change")
    async with page.expect_response(lambda r: "/dashboard/overview" in r.url and r.request.method == "GET") as answer:
        await page.click("#apply")
    assert (await answer.value).status == 400
    await page.wait_for_selector(f"#{field}-error")
    assert words in await page.inner_text(f"#{field}-error")
    assert await page.get_attribute(f"#{field}", "aria-invalid") == "true"
    assert await page.input_value(f"#{field}") == typed  # what was typed stays, to be corrected
    assert await page.query_selector("[data-tile]") is None  # no numbers of some other window


async def test_key_status_and_buckets_are_controls_that_later_applies_keep(dashboard_server, page):
    first, _ = await sign_in(page, dashboard_server)
    key = await dashboard_server.admin("POST", "/admin/keys", name="the nightly job", team_id=first)
    await dashboard_server.ledger.record(usage(team_id=first, key_id=key["id"],
                                               model="HuggingFaceTB/SmolLM2-135M-Instruct", status="error",
                                               error_code="upstream_failed", error_status=502))
    await dashboard_server.ledger.flush(10)
    await page.reload()
    # the model is chosen from what the team used (a partial name typed into a box found nothing)
    models = await page.eval_on_selector_all("#model option", "options => options.map(o => o.value)")
    assert models == ["", "HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert "the nightly job" in await page.inner_text("#key_id")  # keys by name
    await page.select_option("#key_id", key["id"])
    await page.select_option("#status", "error")
    await page.select_option("#granularity", "hour")
    await page.click("#apply")
    await page.wait_for_url("**status=error**")
    assert params(page.url)["key_id"] == key["id"] and params(page.url)["granularity"] == "hour"
    assert "Over time (hour)" in await page.inner_text("#content")
    await page.select_option("#range", "24h")  # the next Apply keeps the filters
    await page.click("#apply")
    await page.wait_for_url("**range=24h**")
    kept = params(page.url)
    assert (kept["key_id"], kept["status"], kept["granularity"]) == (key["id"], "error", "hour")
    assert await page.input_value("#status") == "error"
    assert (await page.inner_text("[data-tile=requests]")).strip() == "1"
