"""The owners' pages: the team's members and its read-only audit log. Owners (and the admin) see them and
their links; a member or a service key gets neither (403). The audit log holds the team's own entries only,
and a cursor the page did not hand out is said at the paging link."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.dashboard.test_dashboard_details import signed_in

pytestmark = pytest.mark.slow


@pytest.fixture
async def crew(dashboard_server) -> dict:
    team = (await dashboard_server.admin("POST", "/admin/teams", name="Crew"))["id"]
    other = (await dashboard_server.admin("POST", "/admin/teams", name="Elsewhere"))["id"]
    users = {name: (await dashboard_server.admin("POST", "/admin/users", name=name))["id"] for name in ("olive", "max")}
    await dashboard_server.admin("PUT", f"/admin/teams/{team}/members/{users['olive']}", role="owner")
    await dashboard_server.admin("PUT", f"/admin/teams/{team}/members/{users['max']}", role="member")
    owner = await dashboard_server.admin("POST", "/admin/keys", name="olive's", team_id=team, user_id=users["olive"])
    member = await dashboard_server.admin("POST", "/admin/keys", name="max's", team_id=team, user_id=users["max"])
    service = await dashboard_server.admin("POST", "/admin/keys", name="crew bot", team_id=team)
    elsewhere = await dashboard_server.admin("POST", "/admin/keys", name="secret elsewhere", team_id=other)
    return {"id": team, "other": other, "users": users, "owner": owner, "member": member, "service": service,
            "elsewhere": elsewhere}


async def test_owner_reads_members_and_the_teams_audit_log_in_chromium(dashboard_server, crew, page, artifacts):
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", crew["owner"]["key"])
    await page.click("button[type=submit]")
    await page.click("nav >> text=Members")
    await page.wait_for_selector("table[data-members]")
    roles = {await row.get_attribute("data-user-id"): (await row.locator("[data-role]").inner_text()).strip()
             for row in await page.locator("tr[data-user-id]").all()}
    assert roles == {crew["users"]["olive"]: "owner", crew["users"]["max"]: "member"}
    # owners run their members (tests/gateway/dashboard/test_dashboard_accounts_browser.py): the last owner
    # is offered neither a demotion nor removal
    assert await page.locator(f"tr[data-user-id='{crew['users']['olive']}'] form").count() == 0
    assert await page.locator(f"tr[data-user-id='{crew['users']['max']}'] form").count() == 2
    await page.screenshot(path=artifacts / "members.png", full_page=True)

    await page.click("nav >> text=Audit log")
    await page.wait_for_selector("table[data-audit]")
    text = await page.inner_text("table[data-audit]")
    assert "keys.create" in text and "members.put" in text and crew["service"]["id"] in text
    assert crew["elsewhere"]["id"] not in text and "secret elsewhere" not in text
    await page.screenshot(path=artifacts / "audit.png", full_page=True)


async def test_members_and_audit_are_for_owners_only(dashboard_server, crew):
    for who in ("member", "service"):
        async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
            await signed_in(client, crew[who]["key"])
            overview = (await client.get("/dashboard/overview", params={"team_id": crew["id"]})).text
            assert "/dashboard/members" not in overview and "/dashboard/audit" not in overview
            for path in ("/dashboard/members", "/dashboard/audit"):
                assert (await client.get(path, params={"team_id": crew["id"]})).status_code == 403, (who, path)
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
        await signed_in(client, crew["owner"]["key"])
        # another team: not reachable, the same 404 as a team that does not exist
        for team in (crew["other"], "team_nosuch"):
            assert (await client.get("/dashboard/audit", params={"team_id": team})).status_code == 404
            assert (await client.get("/dashboard/members", params={"team_id": team})).status_code == 404
        bad = await client.get("/dashboard/audit", params={"team_id": crew["id"], "cursor": "not-a-cursor"})
        assert bad.status_code == 400 and 'id="cursor-error"' in bad.text
        zone = await client.get("/dashboard/members", params={"team_id": crew["id"], "tz": "Mars/Olympus"})
        assert zone.status_code == 400 and 'id="tz-error"' in zone.text


async def test_the_audit_log_says_what_changed_in_words(dashboard_server, crew, page, artifacts):
    """An edit's limits and models, a block's reason: written as the keys page writes them, never as Python's
    repr ("{'rpm': 60}", "['small']", "None", "True")."""
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        headers = {"authorization": f"Bearer {crew['owner']['key']}", "x-team-id": crew["id"]}
        edited = await client.patch(f"/v1/team/keys/{crew['service']['id']}", headers=headers, json={
            "models": ["small", "big"], "limits": {"rpm": 60, "spend_budget": {"amount_micros": 5_000_000}}})
        assert edited.status_code == 200, edited.text
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", crew["owner"]["key"])
    await page.click("button[type=submit]")
    await page.click("nav >> text=Audit log")
    row = page.locator("tr[data-audit-id]", has_text="keys.edit").first
    limits = await row.locator("[data-detail=limits]").inner_text()
    models = await row.locator("[data-detail=models]").inner_text()
    assert limits == "limits: rpm 60 · $5.00 a month, hard", limits
    assert models == "models: small, big", models
    details = "\n".join(await page.locator("table[data-audit] td[data-label=Detail]").all_inner_texts())
    for python in ("{'", "['", "None", "True", "False"):
        assert python not in details, (python, details)
    await row.screenshot(path=artifacts / "audit-edit-row.png")
