"""The small things a reader meets: service-key traffic is labelled, a team with minutes of traffic gets no
month-end projection (one from a few days says it is an early estimate), request times carry seconds, the keys
page speaks the view's zone, and the pages have a favicon."""

from __future__ import annotations

import re
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import httpx
import pytest

from tests.billing.factory import usage
from tests.gateway.dashboard.browser import chromium_page


async def signed_in(client: httpx.AsyncClient, key: str) -> None:
    token = re.search(r'name="csrf" value="([^"]+)"', (await client.get("/dashboard/login")).text).group(1)
    answer = await client.post("/dashboard/login", data={"csrf": token, "api_key": key}, follow_redirects=False)
    assert answer.status_code == 303, answer.text


@pytest.fixture
async def team(dashboard_server) -> dict:
    """A team with an owner's personal key and a service key; one request through each, minutes ago."""
    team, user, personal = await dashboard_server.owned_team("Details", "dora", "dora's")
    service = await dashboard_server.admin("POST", "/admin/keys", name="batch", team_id=team)
    for key, user_id in ((personal, user), (service, None)):
        await dashboard_server.ledger.record(usage(team_id=team, key_id=key["id"], user_id=user_id,
                                                   time=time.time() - 120))
    await dashboard_server.ledger.flush(10)
    return {"id": team, "personal": personal, "service": service}


async def test_overview_labels_service_traffic_and_projects_nothing_from_minutes(dashboard_server, team):
    """Issue 44: main carried an hour's spend over the month ($0.26 -> $158.94); under a full day of traffic the
    tile shows no projection, and says when one comes."""
    async with httpx.AsyncClient(base_url=dashboard_server.url, follow_redirects=True) as client:
        await signed_in(client, team["personal"]["key"])
        page = (await client.get("/dashboard/overview", params={"team_id": team["id"]})).text
    by_user = re.search(r'<table data-breakdown="user"[^>]*>.*?</table>', page, re.S).group(0)
    assert re.search(r'data-id="-"><em>service keys</em>', by_user), by_user
    caveat = re.search(r"<small data-caveat>([^<]+)</small>", page)
    assert caveat and caveat.group(1) == "after a full day of traffic", page  # a team minutes old
    assert re.search(r'data-tile="month_projection" data-micros="">—<', page)
    assert re.search(r'<link rel="icon" href="/dashboard/static/favicon.svg\?v=[0-9a-f]{12}"', page)
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        icon = await client.get("/dashboard/static/favicon.svg")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")


async def test_request_times_have_seconds_and_keys_show_the_views_zone(dashboard_server, team):
    zone = "Asia/Kolkata"
    async with httpx.AsyncClient(base_url=dashboard_server.url, follow_redirects=True) as client:
        await signed_in(client, team["personal"]["key"])
        requests = (await client.get("/dashboard/requests", params={"team_id": team["id"], "tz": zone})).text
        times = re.findall(r'<th data-label="Time" scope="row">([^<]+)</th>', requests)
        assert len(times) == 2 and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", t) for t in times), times
        keys_link = re.search(r'<a href="(/dashboard/keys\?[^"]+)"', requests).group(1).replace("&amp;", "&")
        keys = (await client.get(keys_link)).text
    assert f"Created ({zone})" in keys
    listed = (await dashboard_server.admin("GET", f"/admin/keys?team_id={team['id']}"))["data"]
    created = next(k["created_at"] for k in listed if k["id"] == team["service"]["id"])
    moment = datetime.fromisoformat(created) if isinstance(created, str) else datetime.fromtimestamp(created)
    local = moment.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M")
    row = re.search(rf'<tr data-key-id="{team["service"]["id"]}">.*?</tr>', keys, re.S).group(0)
    assert f'data-label="Created">{local}<' in row, row


async def test_dark_mode_follows_the_system_setting(dashboard_server, team, artifacts):
    async with chromium_page(color_scheme="dark") as page:
        await page.goto(f"{dashboard_server.url}/dashboard/login")
        await page.fill("#api_key", team["personal"]["key"])
        await page.click("button[type=submit]")
        await page.wait_for_selector("[data-chart=tokens] canvas")
        page_bg, card_bg, ink = await page.evaluate("""() => [
            getComputedStyle(document.documentElement).backgroundColor,
            getComputedStyle(document.querySelector('.tile')).backgroundColor,
            getComputedStyle(document.body).color]""")
        axis = await page.eval_on_selector("[data-chart=tokens]", """box => {
            const stroke = box.plot.axes[1].stroke;
            return typeof stroke === "function" ? stroke(box.plot, 1) : stroke;
        }""")
        await page.screenshot(path=artifacts / "overview-dark.png", full_page=True)
    assert page_bg == "rgb(18, 21, 28)" and card_bg == "rgb(28, 33, 43)" and ink == "rgb(228, 231, 238)"
    assert axis == "#e4e7ee"  # the chart's axis text is the page's ink, readable on the dark card
