"""Destructive key actions in Chromium: revoke, rotate and block ask first and say what will happen; the key
the viewer is signed in with cannot be revoked from under them; a reload after Create makes no second key;
a key in its grace period is not rotated again (the team API refuses it too)."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.dashboard.served import ADMIN_KEY

pytestmark = pytest.mark.slow


async def owner(dashboard_server) -> tuple[str, dict]:
    """A team whose owner (alice) has a personal key, and a service key in it."""
    team, _, key = await dashboard_server.owned_team("Acme", "alice", "alice laptop")
    return team, key


async def sign_in(page, dashboard_server, key: str, team: str) -> None:
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", key)
    await page.click("button[type=submit]")
    await page.goto(f"{dashboard_server.url}/dashboard/keys?team_id={team}")


async def status_of(dashboard_server, key: str) -> int:
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        return (await client.get("/v1/usage", headers={"authorization": f"Bearer {key}"})).status_code


async def row_status(page, key_id: str) -> str:
    return (await page.inner_text(f"tr[data-key-id='{key_id}'] [data-status]")).strip()


async def test_revoke_asks_first_and_cancel_keeps_the_key(dashboard_server, page, artifacts):
    team, alice = await owner(dashboard_server)
    service = await dashboard_server.admin("POST", "/admin/keys", name="ci runner", team_id=team)
    await sign_in(page, dashboard_server, alice["key"], team)
    await page.locator(f"tr[data-key-id='{service['id']}'] [data-action=revoke]").click()
    await page.wait_for_selector("#confirm")
    assert "ci runner" in await page.inner_text("#confirm h1")
    assert "refused from now on (401)" in await page.inner_text("#consequence")
    await page.screenshot(path=artifacts / "keys-confirm-revoke.png", full_page=True)
    await page.click("#cancel")
    assert await row_status(page, service["id"]) == "active"
    assert await status_of(dashboard_server, service["key"]) == 200

    await page.locator(f"tr[data-key-id='{service['id']}'] [data-action=revoke]").click()
    await page.click("#confirm-action")
    await page.wait_for_url("**/dashboard/keys**")
    assert await row_status(page, service["id"]) == "revoked"
    assert await status_of(dashboard_server, service["key"]) == 401


@pytest.mark.parametrize("who", ["owner", "admin"])
async def test_the_key_you_are_signed_in_with_cannot_be_revoked(dashboard_server, page, who):
    team, alice = await owner(dashboard_server)
    if who == "admin":
        listed = (await dashboard_server.admin("GET", "/admin/keys?limit=200"))["data"]
        alice = {"key": ADMIN_KEY, "id": next(k["id"] for k in listed if k["is_admin"])}
    await sign_in(page, dashboard_server, alice["key"], team)
    if who == "admin":
        await page.goto(f"{dashboard_server.url}/dashboard/keys?team_id={team}&keys_of=")
    assert await page.locator(f"tr[data-key-id='{alice['id']}'] [data-action=revoke]").count() == 0  # not offered
    csrf = await page.get_attribute("#sign-out-form input[name=csrf]", "value")
    forged = await page.request.post(f"{dashboard_server.url}/dashboard/keys/{alice['id']}/revoke?team_id={team}",
                                     form={"csrf": csrf, "confirm": "yes"})
    assert forged.status == 409 and "signed in with" in await forged.text()
    assert await status_of(dashboard_server, alice["key"]) == 200


async def test_rotating_your_own_key_without_grace_warns_of_the_sign_out(dashboard_server, page):
    team, alice = await owner(dashboard_server)
    await sign_in(page, dashboard_server, alice["key"], team)
    row = page.locator(f"tr[data-key-id='{alice['id']}']")
    await row.locator("input[name=grace_seconds]").fill("0")
    await row.locator("[data-action=rotate]").click()
    consequence = await page.inner_text("#consequence")
    assert "stops at once" in consequence and "this session ends" in consequence
    await page.click("#cancel")
    assert await status_of(dashboard_server, alice["key"]) == 200  # nothing happened


async def test_a_reload_after_create_makes_no_second_key_and_grace_keys_rotate_once(dashboard_server, page):
    team, alice = await owner(dashboard_server)
    await sign_in(page, dashboard_server, alice["key"], team)
    await page.fill("#key-name", "nightly")
    await page.click("#create-key")
    created = (await page.inner_text("#new-key")).strip()
    await page.reload()
    assert await page.query_selector("#new-key") is None  # shown once
    assert await page.locator("tr", has_text="nightly").count() == 1

    row = page.locator("tr", has_text="nightly")
    await row.locator("input[name=grace_seconds]").fill("600")
    await row.locator("[data-action=rotate]").click()
    assert "keeps working for 600 s" in await page.inner_text("#consequence")
    await page.click("#confirm-action")
    await page.wait_for_selector("#new-key")
    old_id = created.split("-")[2]
    await page.goto(f"{dashboard_server.url}/dashboard/keys?team_id={team}")
    assert await row_status(page, old_id) == "replaced (grace)"
    assert await page.locator(f"tr[data-key-id='{old_id}'] [data-action=rotate]").count() == 0
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        again = await client.post(f"/v1/team/keys/{old_id}/rotate", json={},
                                  headers={"authorization": f"Bearer {alice['key']}", "x-team-id": team})
    assert again.status_code == 409 and again.json()["error"]["code"] == "key_already_replaced", again.text
