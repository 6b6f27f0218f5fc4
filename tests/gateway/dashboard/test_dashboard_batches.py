"""The Batches page (#48): a team's owners and members see its batches with progress and counts and download
their output and error files; a service key's session gets 403, another team's batches and files are not
reachable (404). The batch is a real one through the API: its line names a model no one serves, so it ends with
an error file."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.gateway.dashboard.test_dashboard_details import signed_in

pytestmark = pytest.mark.slow


async def _batch(url: str, key: str) -> dict:
    headers = {"authorization": f"Bearer {key}"}
    line = {"custom_id": "only", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "nobody-serves-this", "messages": [{"role": "user", "content": "hi"}]}}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
        uploaded = await client.post("/v1/files", data={"purpose": "batch"},
                                     files={"file": ("in.jsonl", json.dumps(line).encode() + b"\n")})
        assert uploaded.status_code == 200, uploaded.text
        created = await client.post("/v1/batches", json={"input_file_id": uploaded.json()["id"],
                                                         "endpoint": "/v1/chat/completions",
                                                         "completion_window": "24h"})
        assert created.status_code == 200, created.text
        deadline = time.monotonic() + 60
        while (batch := (await client.get(f"/v1/batches/{created.json()['id']}")).json())["status"] != "completed":
            assert time.monotonic() < deadline, batch
            await asyncio.sleep(0.2)
    return batch


async def test_members_see_their_teams_batches_and_download_the_files(dashboard_server, page, artifacts):
    team, _, owner = await dashboard_server.owned_team("Batchers", "bea", "bea's")
    member_user = (await dashboard_server.admin("POST", "/admin/users", name="ben"))["id"]
    await dashboard_server.admin("PUT", f"/admin/teams/{team}/members/{member_user}", role="member")
    member = await dashboard_server.admin("POST", "/admin/keys", name="ben's", team_id=team, user_id=member_user)
    service = await dashboard_server.admin("POST", "/admin/keys", name="bot", team_id=team)
    other_team, _, stranger = await dashboard_server.owned_team("Others", "oz", "oz's")
    batch = await _batch(dashboard_server.url, owner["key"])
    theirs = await _batch(dashboard_server.url, stranger["key"])

    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", member["key"])
    await page.click("button[type=submit]")
    await page.click("nav >> text=Batches")
    row = page.locator(f"tr[data-batch-id='{batch['id']}']")
    await row.wait_for()
    assert (await row.locator("[data-status]").inner_text()).strip() == "completed"
    assert (await row.locator("[data-errored]").inner_text()).strip() == "1"
    assert await page.locator(f"tr[data-batch-id='{theirs['id']}']").count() == 0
    await page.screenshot(path=artifacts / "batches.png", full_page=True)
    link = await row.locator("a[data-file=error]").get_attribute("href")

    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
        await signed_in(client, member["key"])
        errors = await client.get(link)
        assert errors.status_code == 200 and json.loads(errors.text.splitlines()[0])["custom_id"] == "only"
        foreign = f"/dashboard/batches/files/{theirs['error_file_id']}"
        assert (await client.get(foreign, params={"team_id": team})).status_code == 404
        assert (await client.get("/dashboard/batches", params={"team_id": other_team})).status_code == 404
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
        await signed_in(client, service["key"])
        assert (await client.get("/dashboard/batches", params={"team_id": team})).status_code == 403
        assert (await client.get(link)).status_code == 403
        assert "/dashboard/batches" not in (await client.get("/dashboard/overview", params={"team_id": team})).text
