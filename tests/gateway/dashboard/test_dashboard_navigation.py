"""Getting around the dashboard in Chromium: sign-in comes back to the page that asked for it (a page of this
dashboard only); every link keeps the zone the reader chose; an applied filter form leaves empty fields out of
the URL; the first Tab stop skips the bar."""

from __future__ import annotations

from urllib.parse import parse_qs, quote, urlparse

import httpx
import pytest

pytestmark = pytest.mark.slow
TOKYO = "Asia/Tokyo"


@pytest.fixture
async def acme(dashboard_server) -> dict:
    team, _, alice = await dashboard_server.owned_team("Acme", "alice", "alice laptop")
    service = await dashboard_server.admin("POST", "/admin/keys", name="batch", team_id=team)
    return {"team": team, "alice": alice, "service": service}


def params(url: str) -> dict[str, list[str]]:
    return parse_qs(urlparse(url).query, keep_blank_values=True)


async def submit_key(page, key: str) -> None:
    await page.fill("#api_key", key)
    await page.click("button[type=submit]")


async def test_sign_in_comes_back_to_the_page_asked_for(dashboard_server, acme, page):
    wanted = f"/dashboard/requests?team_id={acme['team']}&range=30d&tz={quote(TOKYO, safe='')}"
    await page.goto(f"{dashboard_server.url}{wanted}")
    await page.wait_for_url("**/dashboard/login?next=**")
    await submit_key(page, "sk-sluice-wrong")  # a failed try keeps where it was going
    await page.wait_for_selector("#login-message")
    await submit_key(page, acme["alice"]["key"])
    await page.wait_for_url("**/dashboard/requests?**")
    assert page.url == f"{dashboard_server.url}{wanted}"


@pytest.mark.parametrize("elsewhere", ["https://evil.example/", "//evil.example/dashboard/", "/dashboard/../admin",
                                       "/dashboard/\\evil", "/v1/usage", "/dashboard/logout"])
async def test_sign_in_never_sends_elsewhere(dashboard_server, acme, elsewhere):
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        form = (await client.get("/dashboard/login", params={"next": elsewhere})).text
        assert 'name="next"' not in form
        csrf = form.split('name="csrf" value="')[1].split('"')[0]
        answer = await client.post("/dashboard/login", data={"csrf": csrf, "api_key": acme["alice"]["key"],
                                                             "next": elsewhere}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/dashboard/overview", answer.headers


async def test_every_link_keeps_the_zone(dashboard_server, acme, page):
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await submit_key(page, acme["alice"]["key"])
    await page.goto(f"{dashboard_server.url}/dashboard/overview?team_id={acme['team']}&tz={quote(TOKYO, safe='')}")
    for stop in ("Limits", "Find request", "Members", "Audit log", "Keys", "Overview"):
        for link in ("Overview", "Requests", "Limits", "Find request", "Members", "Audit log", "Keys"):
            href = await page.get_attribute(f"nav >> text={link}", "href")
            assert params(href).get("tz") == [TOKYO], (stop, link, href)
        await page.click(f"nav >> text={stop}")
        await page.wait_for_load_state()
        assert params(page.url).get("tz") == [TOKYO], (stop, page.url)
    # the keys page's own links and the pages its forms answer with
    await page.click("nav >> text=Keys")
    await page.wait_for_url("**/dashboard/keys**")
    edit = await page.get_attribute(f"tr[data-key-id='{acme['service']['id']}'] [data-action=edit]", "href")
    assert params(edit).get("tz") == [TOKYO]
    await page.locator(f"tr[data-key-id='{acme['service']['id']}'] [data-action=revoke]").click()
    await page.click("#cancel")
    await page.wait_for_url("**/dashboard/keys**")
    assert params(page.url).get("tz") == [TOKYO]


async def test_applied_filters_leave_empty_fields_out_of_the_url(dashboard_server, acme, page):
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await submit_key(page, acme["alice"]["key"])
    await page.select_option("#range", "30d")
    await page.click("#apply")
    await page.wait_for_url("**range=30d**")
    sent = params(page.url)
    assert all(value != [""] for value in sent.values()), page.url
    assert sent["range"] == ["30d"] and sent["team_id"] == [acme["team"]]


async def test_the_first_tab_skips_to_the_content(dashboard_server, acme, page):
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await submit_key(page, acme["alice"]["key"])
    await page.wait_for_url("**/dashboard/overview**")
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.textContent") == "Skip to content"
    assert await page.evaluate("document.activeElement.getBoundingClientRect().left >= 0")  # seen when focused
    await page.keyboard.press("Enter")
    assert await page.evaluate("document.activeElement.id") == "main"
