"""The Batches page (#48): a team's owners and members see its batches with progress and counts and download
their output and error files, and each batch's spend (cost, batch and cache savings, exact, from the team's own
records only); a service key's session gets 403, another team's batches and files are not
reachable (404). The batch is a real one through the API: its line names a model no one serves, so it ends with
an error file."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from billing.usage import micros_to_decimal
from tests.billing.factory import usage
from tests.gateway.dashboard.test_dashboard_details import signed_in
from tests.gateway.dashboard.test_dashboard_savings import SMALL

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
    # the batch's spend: its lines' records, never another team's record that names the same batch id
    line = dict(model="small", prompt_tokens=400_000, cached_tokens=100_000, completion_tokens=10_000,
                compute_tokens=10_000, batch_id=batch["id"], custom_id="only")
    for record in (usage(team_id=team, key_id=owner["id"], **line), usage(team_id=team, key_id=owner["id"], **line),
                   usage(team_id=other_team, key_id=stranger["id"], **line)):
        await dashboard_server.ledger.record(record)
    await dashboard_server.ledger.flush(10)
    charge = SMALL.charge(400_000, 10_000, cached_tokens=100_000, batch=True)

    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", member["key"])
    await page.click("button[type=submit]")
    await page.click("nav >> text=Batches")
    row = page.locator(f"tr[data-batch-id='{batch['id']}']")
    await row.wait_for()
    assert (await row.locator("[data-status]").inner_text()).strip() == "completed"
    assert (await row.locator("[data-errored]").inner_text()).strip() == "1"
    spent = {name: await row.locator(f"[data-{name}] .money").first.get_attribute("data-money")
             for name in ("cost", "batch-saved", "cache-saved")}
    assert spent == {"cost": micros_to_decimal(2 * charge.cost_micros),
                     "batch-saved": micros_to_decimal(2 * charge.batch_saved_micros),
                     "cache-saved": micros_to_decimal(2 * charge.cache_saved_micros)}
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
