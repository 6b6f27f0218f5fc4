"""Tenant ↔ tenant: what a team can make the gateway keep with `POST /v1/responses` (`store: true`, OpenAI's default),
through the real `sluice serve` (SQLite in its data dir) in front of the protocol worker, called with the real
`openai` SDK and plain HTTP.

The issue (#43): `metadata` was stored without limit or expiry and counted nowhere: one request billed 32 tokens
stored 3.9 MB, and 61 of them filled a 300 MiB disk, after which every team got a lasting 503
`ledger_unavailable`. Now `metadata` has OpenAI's bounds, one stored response is bounded, a team's stored
responses are counted against its quota (count and bytes, checked in the inserting transaction), responses
expire and are purged, and stored responses stop well before the ledger's disk reserve."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from storage import Database
from storage.registry import connect
from testkit.admin import admin
from testkit.databases import fresh_database
from testkit.protocol_worker import MODEL, worker_process
from testkit.sluice import SluiceServer, running_sluice
from testkit.stub_gateway import ADMIN_KEY
from tests.disks import small_disk

MAX_RESPONSE_BYTES = 16_384
TEAM_MAX_BYTES = 30_000
TEAM_MAX_RESPONSES = 3


@contextlib.contextmanager
def served(data_dir: Path, responses: str, settings: str = "") -> Iterator[SluiceServer]:
    """`sluice serve` with this `[responses]` table, no team limits (the floods here are about storage)."""
    with worker_process(token_delay=0, quiet=True) as worker:
        config = (f'default_team_limits = {{}}\nrejections_per_minute = 1000000\n{settings}\n'
                  f'[responses]\n{responses}\n'
                  f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{worker.url}"] }}\n')
        with running_sluice(data_dir, config=config, env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as server:
            yield server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with served(tmp_path_factory.mktemp("stored"), f"max_response_bytes = {MAX_RESPONSE_BYTES}\n"
                f"team_max_bytes = {TEAM_MAX_BYTES}\nteam_max_responses = {TEAM_MAX_RESPONSES}") as running:
        yield running


def team_key(server: SluiceServer, name: str) -> str:
    team = admin(server, "POST", "/admin/teams", name=name)["id"]
    return admin(server, "POST", "/admin/keys", name=f"{name}-key", team_id=team)["key"]


def create(server: SluiceServer, key: str, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/responses", headers={"authorization": f"Bearer {key}"}, timeout=60,
                      json={"model": MODEL, "input": "Hello", "max_output_tokens": 4, **body})


def retrieve(server: SluiceServer, key: str, response_id: str) -> httpx.Response:
    return httpx.get(f"{server.url}/v1/responses/{response_id}", headers={"authorization": f"Bearer {key}"},
                     timeout=30)


def stored_rows(server: SluiceServer) -> int:
    """The rows of the stored responses' table, read from the database file itself."""
    with contextlib.closing(sqlite3.connect(f"file:{server.data_dir / 'sluice.db'}?mode=ro", uri=True)) as db:
        return db.execute("SELECT COUNT(*) FROM stored_responses").fetchone()[0]


def refused(response: httpx.Response, status: int, code: str, param: str) -> None:
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    # OpenAI types a 404 `invalid_request_error` too
    assert error["type"] == ("service_unavailable" if status == 503 else "invalid_request_error")


def test_metadata_has_openais_bounds_and_a_flood_keeps_nothing(server):
    key = team_key(server, "tagger")
    before = stored_rows(server)
    floods = [{"k": "x" * 3_900_000},  # the request: 3.9 MB kept for 32 tokens
              {f"k{i}": "v" for i in range(17)},  # 17 pairs
              {"k" * 65: "v"},  # a 65-character key
              {"k": "v" * 513},  # a 513-character value
              {"k": 1}, {"k": {"nested": "object"}}]
    for metadata in floods:
        answer = create(server, key, metadata=metadata)
        refused(answer, 400, "invalid_value", "metadata")
        assert len(answer.content) < 2000  # the 3.9 MB value is not echoed back
        refused(create(server, key, metadata=metadata, store=False), 400, "invalid_value", "metadata")
    assert stored_rows(server) == before
    widest = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}  # every bound met exactly
    response = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0).responses.create(
        model=MODEL, input="Hello", max_output_tokens=4, metadata=widest)
    assert response.metadata == widest and retrieve(server, key, response.id).json()["metadata"] == widest


def test_one_stored_response_is_bounded(server):
    key = team_key(server, "talker")
    long_input = "word " * (MAX_RESPONSE_BYTES // 5 + 100)
    refused(create(server, key, input=long_input), 400, "stored_response_too_large", "input")
    refused(create(server, key, input="Hi", instructions=long_input), 400, "stored_response_too_large", "input")
    assert create(server, key, input=long_input, store=False).status_code == 200  # not stored: served

    # an output that takes a response past the bound while it runs: served, not stored, and says so
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    near = "word " * ((MAX_RESPONSE_BYTES - 1500) // 5)
    whole = client.responses.create(model=MODEL, input=near, max_output_tokens=600)
    assert whole.store is False and len(whole.output_text) >= 2000
    streamed = create(server, key, input=near, max_output_tokens=600, stream=True)
    last = json.loads([line for line in streamed.text.splitlines() if line.startswith("data: ")][-1][6:])
    assert last["type"] == "response.incomplete" and last["response"]["store"] is False  # cut by max_output_tokens
    for response_id in (whole.id, last["response"]["id"]):
        assert retrieve(server, key, response_id).status_code == 404

    # a conversation that grows by previous_response_id is refused once what it would store passes the bound
    previous, turns = None, 0
    while (answer := create(server, key, input="word " * 600, previous_response_id=previous)).status_code == 200:
        if previous is not None:  # the whole conversation is in the newest: the team's quota stays clear
            assert httpx.delete(f"{server.url}/v1/responses/{previous}", headers={"authorization": f"Bearer {key}"},
                                timeout=30).status_code == 200
        previous, turns = answer.json()["id"], turns + 1
        assert turns < 20
    refused(answer, 400, "stored_response_too_large", "input")
    assert turns >= 2


def test_a_team_at_its_quota_is_refused_while_another_team_still_stores(server):
    full, other = team_key(server, "hoarder"), team_key(server, "neighbour")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=full, max_retries=0)
    kept = [client.responses.create(model=MODEL, input="Hello", max_output_tokens=4).id
            for _ in range(TEAM_MAX_RESPONSES)]
    with pytest.raises(openai.BadRequestError) as caught:  # a 400: no SDK retries it
        client.responses.create(model=MODEL, input="Hello", max_output_tokens=4)
    assert caught.value.code == "stored_responses_quota_exceeded" and "quota" in caught.value.message
    refused(create(server, full), 400, "stored_responses_quota_exceeded", "store")
    assert create(server, full, store=False).status_code == 200  # serving goes on; storing waits
    assert create(server, other).status_code == 200  # another team is not touched by it

    client.responses.delete(kept[0])  # room again
    assert create(server, full).status_code == 200
    refused(create(server, full), 400, "stored_responses_quota_exceeded", "store")

    # the bytes of a team's responses count too: two of ~12 KB fit in 30,000 bytes, a third does not
    heavy = team_key(server, "heavy")
    middling = "word " * 2400
    assert [create(server, heavy, input=middling).status_code for _ in range(2)] == [200, 200]
    third = create(server, heavy, input=middling)
    refused(third, 400, "stored_responses_quota_exceeded", "store")
    assert "bytes" in third.json()["error"]["message"]


def test_concurrent_creates_never_pass_the_quota(server):
    key = team_key(server, "racer")
    answers: list[httpx.Response] = []
    senders = [threading.Thread(target=lambda: answers.append(create(server, key))) for _ in range(12)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    served_ids = [a.json()["id"] for a in answers if a.status_code == 200]
    assert all(a.status_code in (200, 400) for a in answers), [a.text[:200] for a in answers]
    kept = [i for i in served_ids if retrieve(server, key, i).status_code == 200]
    assert len(kept) == TEAM_MAX_RESPONSES
    # a create that passed the first look but lost the race at its insert was served, and says it was not stored
    lost = [a.json() for a in answers if a.status_code == 200 and a.json()["id"] not in kept]
    assert all(answer["store"] is False for answer in lost)
    print(f"\n12 concurrent creates, quota {TEAM_MAX_RESPONSES}: {len(kept)} stored, {len(lost)} served unstored "
          f"(lost the race at the insert), {len(answers) - len(served_ids)} refused before any work")


def test_responses_expire_and_are_purged(tmp_path):
    with served(tmp_path / "gw", "retention_s = 2\nsweep_interval_s = 0.2\nteam_max_responses = 1") as server:
        key = team_key(server, "forgetful")
        first = create(server, key).json()["id"]
        created = time.monotonic()
        assert retrieve(server, key, first).status_code == 200
        assert create(server, key, previous_response_id=first, store=False).status_code == 200
        refused(create(server, key), 400, "stored_responses_quota_exceeded", "store")
        time.sleep(max(0.0, 2.2 - (time.monotonic() - created)))

        gone = retrieve(server, key, first)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "response_not_found"
        refused(create(server, key, previous_response_id=first), 404, "response_not_found", "previous_response_id")
        deadline = time.monotonic() + 120
        while stored_rows(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stored_rows(server) == 0  # purged from the database, not only hidden
        assert create(server, key).status_code == 200  # an expired response no longer counts


def test_stored_responses_cannot_fill_the_ledgers_disk(tmp_path):
    """The issue's outage: stored responses filled the data dir's disk and the ledger refused every team. Here they
    stop at twice the ledger's reserve (plus room for one insert), with a 503 for `store: true` only."""
    with small_disk(tmp_path / "gw", "16m") as data, \
            served(data, "max_response_bytes = 262144\nteam_max_bytes = 1073741824\nteam_max_responses = 100000",
                   settings="ledger_min_free_bytes = 1048576") as server:
        keys = [team_key(server, f"flooder{i}") for i in range(2)]
        chunk = "word " * 40_000  # ~200 KB a response
        answers = []
        for attempt in range(120):
            answers.append(create(server, keys[attempt % 2], input=chunk))
            if answers[-1].status_code != 200:
                break
        refused(answers[-1], 503, "response_storage_full", "store")
        assert answers[-1].headers["retry-after"] and len(answers) > 5
        free = os.statvfs(data).f_bavail * os.statvfs(data).f_frsize
        print(f"\nstored responses on a 16 MiB disk: {len(answers) - 1} of ~200 KB kept, then 503 with "
              f"{free >> 10} KiB free (ledger reserve 1024 KiB)")
        assert free >= 2 * (1 << 20)
        bystander = team_key(server, "bystander")
        for _ in range(3):  # every team is still served, unstored creates and other routes alike
            assert create(server, bystander, store=False).status_code == 200
            completion = httpx.post(f"{server.url}/v1/completions", headers={"authorization": f"Bearer {bystander}"},
                                    json={"model": MODEL, "prompt": "hi", "max_tokens": 4}, timeout=60)
            assert completion.status_code == 200, completion.text[:300]

        # deleting stored responses makes room again (SQLite reuses their pages): storing resumes by itself
        for index, answer in enumerate(answers[:-1]):
            assert httpx.delete(f"{server.url}/v1/responses/{answer.json()['id']}", timeout=30,
                                headers={"authorization": f"Bearer {keys[index % 2]}"}).status_code == 200
        again = create(server, keys[0], input=chunk)
        assert again.status_code == 200 and retrieve(server, keys[0], again.json()["id"]).status_code == 200


async def test_every_teams_stored_responses_are_bounded_together_on_postgresql(postgres):
    """PostgreSQL has no disk floor of ours, and per-team quotas times the teams bound nothing a tenant with many
    teams cannot exceed: a fleet-wide total (`max_total_bytes`) holds, moved in each inserting transaction. Two
    gateways (two pools on one real database) store for twelve teams at once; the total never passes the bound,
    the refused are `response_storage_full` (503, `param: "store"`), and deletes and the purge make room again."""
    import asyncio

    from gateway.dialects.responses.store import ResponseStorageFull, ResponseStore, StoragePolicy

    policy = StoragePolicy(max_response_bytes=1 << 20, team_max_bytes=1 << 30, team_max_responses=10_000,
                           max_total_bytes=100_000)
    async with fresh_database(postgres, "responses") as url:
        databases = [Database(await connect(url)) for _ in range(2)]
        try:
            stores = [ResponseStore(db, policy) for db in databases]
            text = "x" * 9_000

            async def create(index: int) -> tuple[str, str] | None:
                team, response = f"team{index % 12}", {"id": f"resp_{index}", "output": text}
                try:
                    await stores[index % 2].save(team, response, [])
                    return team, response["id"]
                except ResponseStorageFull as full:
                    assert (full.status, full.code, full.param) == (503, "response_storage_full", "store")
                    return None

            kept = [made for made in await asyncio.gather(*(create(i) for i in range(40))) if made is not None]
            rows = await databases[0].fetchone("SELECT COUNT(*), SUM(bytes) FROM stored_responses")
            total = await stores[1].total_bytes()
            assert rows[0] == len(kept) and 0 < rows[1] == total <= policy.max_total_bytes
            assert len(kept) == policy.max_total_bytes // (total // len(kept))  # full, not stopped early
            with pytest.raises(ResponseStorageFull):  # refused before any work too
                await stores[0].admit("a-new-team", 9_000, "input")

            assert await stores[0].delete(*kept[0])  # whichever of the racing saves got in first
            await stores[1].save("a-new-team", {"id": "resp_new", "output": text}, [])
            assert await stores[0].purge_expired(now=time.time() + policy.retention_s + 1) == len(kept)
            assert await stores[1].total_bytes() == 0
        finally:
            for db in databases:
                await db.close()
