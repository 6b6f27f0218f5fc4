"""Blocks on the keys page, in Chromium: no one is offered to block (or revoke) the key they are signed in with
and a forged form is refused on a page that still has the bar and Sign out; blocking another key of one's own says
so; the admin sees where a key is blocked and unblocks it there."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.gateway.dashboard.served import ADMIN_KEY

pytestmark = pytest.mark.slow


@pytest.fixture
async def acme(dashboard_server) -> dict:
    """Acme, owned by alice (two personal keys: laptop and phone), with bob a member (one personal key)."""
    team, alice_id, laptop = await dashboard_server.owned_team("Acme", "alice", "alice laptop")
    phone = await dashboard_server.admin("POST", "/admin/keys", name="alice phone", team_id=team, user_id=alice_id)
    bob_id = (await dashboard_server.admin("POST", "/admin/users", name="bob"))["id"]
    await dashboard_server.admin("PUT", f"/admin/teams/{team}/members/{bob_id}", role="member")
    bob = await dashboard_server.admin("POST", "/admin/keys", name="bob laptop", team_id=team, user_id=bob_id)
    return {"team": team, "laptop": laptop, "phone": phone, "bob": bob}


async def sign_in(page, dashboard_server, key: str) -> None:
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", key)
    await page.click("button[type=submit]")
    await page.wait_for_url("**/dashboard/**")


async def acts_in(dashboard_server, key: str, team: str) -> bool:
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        answer = await client.get("/v1/team", headers={"authorization": f"Bearer {key}", "x-team-id": team})
    return answer.status_code == 200


async def test_no_one_blocks_the_key_they_are_signed_in_with(dashboard_server, acme, page, artifacts):
    laptop, team = acme["laptop"], acme["team"]
    await sign_in(page, dashboard_server, laptop["key"])
    await page.goto(f"{dashboard_server.url}/dashboard/keys?team_id={team}")
    own = page.locator(f"tr[data-key-id='{laptop['id']}']")
    assert await own.locator("[data-action=block], [data-action=revoke]").count() == 0
    assert await own.locator("[data-action=rotate]").count() == 1  # rotating keeps you in (with a grace)

    # a forged form (the page's own CSRF token): refused before anything changes, on a page with a way out
    csrf = await page.get_attribute("#sign-out-form input[name=csrf]", "value")
    for action in ("block", "revoke"):
        await page.evaluate("""([action, csrf]) => {
            const form = document.createElement("form");
            form.method = "post"; form.action = action;
            const field = document.createElement("input");
            field.name = "csrf"; field.value = csrf; form.append(field);
            document.body.append(form); form.submit();
        }""", [f"/dashboard/keys/{laptop['id']}/{action}?team_id={team}&confirm=yes", csrf])
        await page.wait_for_selector("#error-message")
        assert "lock you out" in await page.inner_text("#error-message")
        assert await page.locator("nav >> text=Keys").count() == 1 and await page.locator("#sign-out").count() == 1
        await page.screenshot(path=artifacts / f"keys-own-{action}-refused.png", full_page=True)
        await page.go_back()
    assert await acts_in(dashboard_server, laptop["key"], team)

    # another key of one's own may be blocked, and the question says whose it is
    await page.goto(f"{dashboard_server.url}/dashboard/keys?team_id={team}")
    await page.locator(f"tr[data-key-id='{acme['phone']['id']}'] [data-action=block]").click()
    assert "one of your own keys" in await page.inner_text("#consequence")
    await page.click("#cancel")
    assert await acts_in(dashboard_server, acme["phone"]["key"], team)


async def test_an_error_page_keeps_the_bar_and_sign_out(dashboard_server, acme, page, artifacts):
    await sign_in(page, dashboard_server, acme["bob"]["key"])
    await page.goto(f"{dashboard_server.url}/dashboard/keys?team_id={acme['team']}")  # a member: 403
    assert "owners" in await page.inner_text("#error-message")
    assert await page.locator("nav >> text=Overview").count() == 1
    await page.screenshot(path=artifacts / "error-403.png", full_page=True)
    await page.goto(f"{dashboard_server.url}/dashboard/overview?team_id=team_nope")  # not a team of bob's: 404
    await page.click("#sign-out")
    await page.wait_for_url("**/dashboard/login")


async def test_the_admin_sees_blocks_and_unblocks(dashboard_server, acme, page, artifacts):
    bob, team = acme["bob"], acme["team"]
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        blocked = await client.post(f"/v1/team/keys/{bob['id']}/block",
                                    headers={"authorization": f"Bearer {acme['laptop']['key']}", "x-team-id": team})
    assert blocked.status_code == 200, blocked.text
    assert not await acts_in(dashboard_server, bob["key"], team)

    await sign_in(page, dashboard_server, ADMIN_KEY)
    await page.goto(f"{dashboard_server.url}/dashboard/keys")  # every team's keys
    status = page.locator(f"tr[data-key-id='{bob['id']}'] [data-status]")
    assert re.search(r"blocked in Acme", await status.inner_text())
    await page.screenshot(path=artifacts / "keys-admin-blocked.png", full_page=True)
    await status.locator(f"[data-blocked-in='{team}']").click()
    await page.wait_for_url(f"**keys_of={team}**")
    row = page.locator(f"tr[data-key-id='{bob['id']}']")
    assert await row.locator("[data-status]").inner_text() == "blocked in this team"
    await row.locator("[data-action=unblock]").click()
    await page.wait_for_url(f"**keys_of={team}**")
    assert await page.locator(f"tr[data-key-id='{bob['id']}'] [data-status]").inner_text() == "active"
    assert await acts_in(dashboard_server, bob["key"], team)
