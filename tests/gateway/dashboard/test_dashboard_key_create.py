"""Creating a service key in Chromium: the expiry is a day from the date picker (the end of that day in the
page's zone); a refused field is said at the field with the form as typed, never a page that throws it away."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

pytestmark = pytest.mark.slow


async def signed_in_keys(page, dashboard_server, tz: str = "UTC") -> dict:
    team, _, alice = await dashboard_server.owned_team("Acme", "alice", "alice laptop")
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", alice["key"])
    await page.click("button[type=submit]")
    await page.goto(f"{dashboard_server.url}/dashboard/keys?team_id={team}&tz={tz}")
    return {"team": team, "alice": alice}


async def expiry_of(dashboard_server, key_id: str) -> float:
    listed = (await dashboard_server.admin("GET", "/admin/keys?limit=200"))["data"]
    iso = next(k for k in listed if k["id"] == key_id)["expires_at"]
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


async def test_a_keys_expiry_is_a_day_in_the_pages_zone(dashboard_server, page):
    await signed_in_keys(page, dashboard_server, tz="Asia/Tokyo")
    assert await page.get_attribute("#key-expires", "type") == "date"
    await page.fill("#key-name", "until new year")
    await page.fill("#key-expires", "2030-12-31")
    await page.click("#create-key")
    key = (await page.inner_text("#new-key")).strip()
    # the end of 2030-12-31 in Tokyo is 15:00 UTC that day
    assert await expiry_of(dashboard_server, key.split("-")[2]) == datetime(2030, 12, 31, 15, tzinfo=UTC).timestamp()
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        assert (await client.get("/v1/usage", headers={"authorization": f"Bearer {key}"})).status_code == 200


@pytest.mark.parametrize("expires, field, words", [
    ("2001-01-01", "expires_on", "in the future"),
    ("31/12/2030", "expires_on", "Choose a day"),
])
async def test_a_refused_expiry_is_said_at_the_field_with_the_form_kept(dashboard_server, page, expires, field,
                                                                        words):
    await signed_in_keys(page, dashboard_server)
    await page.fill("#key-name", "nightly batch")
    # what a browser without a date picker (or a pasted value) sends
    await page.evaluate("([v]) => { const f = document.querySelector('#key-expires'); f.type = 'text'; f.value = v; }",
                        [expires])
    await page.click("#create-key")
    await page.wait_for_selector(f"#{field}-error")
    assert words in await page.inner_text(f"#{field}-error")
    assert await page.input_value("#key-name") == "nightly batch"  # nothing typed is lost
    assert await page.get_attribute("#key-expires", "aria-invalid") == "true"
    assert await page.locator("table[data-keys] tr", has_text="nightly batch").count() == 0  # and nothing made
