"""End users and tags as a team finds them: requests sent by the real SDKs (OpenAI's `user` and `metadata` on Chat
Completions, Completions and Responses; Anthropic's `metadata.user_id`) through the served gateway, recorded in the
ledger, found by `end_user` and `tag` in `GET /v1/usage/requests` (JSON and CSV) and on the dashboard's requests
page in Chromium (the filter form, the CSV of the view), never in another team's."""

from __future__ import annotations

import asyncio
import csv
import io
import json

import anthropic
import httpx
import openai
import pytest

from testkit.protocol_worker import MODEL
from tests.gateway.dashboard.test_dashboard_accessibility import sign_in, violations
from tests.gateway.dashboard.test_dashboard_budgets import priced_gateway

pytestmark = pytest.mark.slow
TAGS = {"env": "prod", "run": "7"}


@pytest.fixture
async def served(tmp_path):
    async with priced_gateway(tmp_path) as server:
        yield server


def _sent_by_the_sdks(url: str, key: str) -> dict[str, str]:
    """One request of each kind; the request id of each."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    chat = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, user="alice", metadata=TAGS)
    completion = client.completions.with_raw_response.create(model=MODEL, prompt="hi", max_tokens=2, user="bob")
    response = client.responses.with_raw_response.create(model=MODEL, input="hi", max_output_tokens=16,
                                                         metadata={"env": "staging"})
    claude = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    message = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}], metadata={"user_id": "carol"})
    return {name: r.headers["x-request-id"] for name, r in (("chat", chat), ("completion", completion),
                                                            ("response", response), ("message", message))}


async def test_the_sdks_end_users_and_tags_are_recorded_and_found_by_their_team_only(served, page):
    team, _, owner = await served.owned_team("Acme", "olga", "olga")
    other, _, stranger = await served.owned_team("Other", "ozzie", "ozzie")
    sent = await asyncio.to_thread(_sent_by_the_sdks, served.url, owner["key"])
    await served.ledger.flush(10)

    async def found(key: str, **query) -> list[dict]:
        async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
            answer = await client.get("/v1/usage/requests", params=query, headers={"authorization": f"Bearer {key}"})
        assert answer.status_code == 200, answer.text
        return answer.json()["data"]

    records = {r["request_id"]: r for r in await found(owner["key"])}
    assert {name: (records[rid]["end_user"], records[rid]["tags"]) for name, rid in sent.items()} == {
        "chat": ("alice", TAGS), "completion": ("bob", {}), "response": (None, {"env": "staging"}),
        "message": ("carol", {})}
    ids = lambda rows: {r["request_id"] for r in rows}  # noqa: E731
    assert ids(await found(owner["key"], end_user="alice")) == {sent["chat"]}
    assert ids(await found(owner["key"], tag=["env=prod", "run=7"])) == {sent["chat"]}
    assert ids(await found(owner["key"], tag=["env=prod", "run=8"])) == set()
    assert ids(await found(owner["key"], end_user=["bob", "carol"])) == {sent["completion"], sent["message"]}
    assert await found(stranger["key"], end_user="alice") == [] and await found(stranger["key"], tag="env=prod") == []
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        for bad in ({"tag": "no-equals"}, {"tag": "=x"}, {"tag": "k=\x07"}, {"end_user": "x" * 257},
                    {"tag": [f"k{i}=v" for i in range(9)]}):
            refused = await client.get("/v1/usage/requests", params=bad,
                                       headers={"authorization": f"Bearer {owner['key']}"})
            assert refused.status_code == 400, (bad, refused.text)

    # the requests page, as its owner filters it
    await sign_in(page, served, owner["key"])
    await page.goto(f"{served.url}/dashboard/requests?team_id={team}&range=24h")
    await page.fill("#tag", "env=staging")
    await page.click("#apply")
    await page.wait_for_url("**tag=env%3Dstaging**")
    rows = page.locator("table[data-requests=list] tbody tr")
    assert await rows.count() == 1
    assert await rows.locator("[data-tag]").get_attribute("data-tag") == "env=staging"
    assert await violations(page) == []
    async with page.expect_download() as download:
        await page.click("#export-csv")
    exported = list(csv.DictReader(io.StringIO((await (await download.value).path()).read_text())))
    assert [(r["request_id"], json.loads(r["tags"])) for r in exported] == [(sent["response"], {"env": "staging"})]
    await page.fill("#tag", "")
    await page.fill("#end_user", "alice")
    await page.click("#apply")
    await page.wait_for_url("**end_user=alice**")
    assert await page.locator("table[data-requests=list] [data-end-user=alice]").count() == 1
    # another team's requests page is no door to them
    answer = await page.goto(f"{served.url}/dashboard/requests?team_id={other}&range=24h&end_user=alice")
    assert answer.status in (403, 404) and sent["chat"] not in await page.content()
