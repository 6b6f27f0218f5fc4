"""Refused requests are not free (issue #31, item 7): 401s, 404s and 422s count against a budget per key and
per client address (the real client: X-Forwarded-For from a trusted proxy), kept by the limiter (in-process or
Redis); past it the answer is a 429 with Retry-After in the dialect's envelope, and what the ledger stores of
each refusal is bounded. On main, 80 404s with 100 KB model names at rpm 60 met no 429 and each was stored in
full."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import httpx
import pytest

from billing.bounds import MAX_NAME_CHARS
from gateway.config import load_settings
from testkit.admin import default_team_key, wait_for_records
from testkit.protocol_worker import worker_process
from testkit.stub_gateway import sluice_on_worker_process
from testkit.unread_bodies import answer_unread
from tests.faults.load import MODEL

pytestmark = pytest.mark.slow
BUDGET = 5  # rejections_per_minute: the one budget of refusals, 401s included
LONG_MODEL = "u" * 100_000


@pytest.fixture(params=["memory", "redis"])
def limiter_config(request) -> str:
    config = f'rejections_per_minute = {BUDGET}\ntrusted_proxies = ["127.0.0.1/32"]\n'
    if request.param == "redis":
        redis = request.getfixturevalue("redis")
        config += f'redis_url = "{redis.url}"\n'
    return config


@contextlib.contextmanager
def sluice(tmp_path, config: str):
    with worker_process() as stub, sluice_on_worker_process(tmp_path / "gw", stub, config) as server:
        yield server


def post(server, path: str, body: dict, key: str | None, client: str) -> httpx.Response:
    headers = {"x-forwarded-for": client}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=60)


def unknown_model(server, key: str, client: str) -> httpx.Response:
    return post(server, "/v1/completions", {"model": LONG_MODEL, "prompt": "hi", "max_tokens": 4}, key, client)


def invalid_body(server, key: str, client: str) -> httpx.Response:
    return post(server, "/v1/chat/completions", {"model": MODEL, "messages": "not a list"}, key, client)


def valid(server, key: str, client: str) -> httpx.Response:
    return post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4}, key, client)


def assert_budget_refusal(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text[:300]
    assert float(response.headers["retry-after"]) > 0
    error = response.json()["error"]  # the OpenAI envelope
    assert error["code"] == "rate_limit_exceeded" and "rejected requests" in error["message"]


def test_a_keys_rejections_meet_429_and_are_stored_bounded(tmp_path, limiter_config):
    with sluice(tmp_path, limiter_config) as server:
        key = default_team_key(server, "hostile", rpm=60)
        # one key from many addresses: the key's budget
        answers = [(unknown_model if i % 2 else invalid_body)(server, key, f"10.1.0.{i}") for i in range(80)]
        # OpenAI's statuses: 400 for a body it refuses, 404 for an unknown model
        assert [r.status_code for r in answers[:BUDGET]] == [400, 404, 400, 404, 400][:BUDGET]
        for response in answers[BUDGET:]:
            assert_budget_refusal(response)
        # the spent key is held until its window frees, valid requests included, from any address
        spent = valid(server, key, "10.1.0.200")
        assert spent.status_code == 429 and 0 < float(spent.headers["retry-after"]) <= 61
        assert "rejected requests" in spent.json()["error"]["message"]
        # another key of the same team, from the same address, is served
        assert valid(server, default_team_key(server, "neighbour", rpm=60), "10.1.0.1").status_code == 200

        # stored: the refusals read, bounded, and the 429 that held the key; a held key's 429s are refused at
        # authentication, unread and unstored, as 401s are
        records = wait_for_records(server, BUDGET + 2)
        assert len(records) == BUDGET + 2
        rejected = [r for r in records if r["status"] == "rejected"]
        assert len(rejected) == BUDGET + 1 and all(len(r["model"]) <= MAX_NAME_CHARS for r in rejected)
        assert sum(r["error_status"] == 429 for r in rejected) == 1


def test_a_spent_key_is_refused_before_its_body_is_read(tmp_path, limiter_config):
    """A key that keeps sending what is refused (a 2 MB body of 400k ids) made the gateway read and parse each
    body before its 429 (issue #43, item 2): now the answer comes while most of the body is still unsent."""
    with sluice(tmp_path, limiter_config) as server:
        key = default_team_key(server, "hostile", rpm=600)
        for index in range(BUDGET + 1):
            invalid_body(server, key, f"10.5.0.{index}")
        status, body = asyncio.run(answer_unread(server.url, key))  # the rest of 1 MB never sent
        assert status == 429, body[:200]
        assert b"rejected requests" in body


def test_an_addresses_rejections_meet_429_whichever_key_sends_them(tmp_path, limiter_config):
    with sluice(tmp_path, limiter_config) as server:
        keys = [default_team_key(server, f"k{i}", rpm=600) for i in range(BUDGET + 3)]
        answers = [unknown_model(server, key, "10.2.0.1") for key in keys]
        assert [r.status_code for r in answers[:BUDGET]] == [404] * BUDGET
        for response in answers[BUDGET:]:
            assert_budget_refusal(response)
        # another address, and a valid request from the spent address, are served as before
        assert unknown_model(server, keys[-1], "10.2.0.2").status_code == 404
        assert valid(server, keys[0], "10.2.0.1").status_code == 200


def test_unauthenticated_401s_count_per_address(tmp_path, limiter_config):
    with sluice(tmp_path, limiter_config) as server:
        body = {"model": MODEL, "prompt": "hi"}
        # no key at all counts too
        answers = [post(server, "/v1/completions", body, None, "10.3.0.1") for _ in range(BUDGET + 3)]
        assert [r.status_code for r in answers[:BUDGET]] == [401] * BUDGET
        for response in answers[BUDGET:]:
            assert response.status_code == 429 and float(response.headers["retry-after"]) > 0
            assert response.json()["error"]["code"] == "rate_limited"
        # the real client counts, not the proxy: another address behind the same proxy is refused plainly
        assert post(server, "/v1/completions", body, None, "10.3.0.2").status_code == 401
        assert post(server, "/v1/completions", body, "sk-not-a-key", "10.3.0.3").status_code == 401
        # a valid key from the spent address is served
        key = default_team_key(server, "fine", rpm=60)
        assert valid(server, key, "10.3.0.1").status_code == 200


def test_the_redis_budget_outlives_a_gateway(tmp_path, redis):
    """Kept in Redis, the budget is the fleet's: a gateway started after another sees what it counted."""
    config = f'rejections_per_minute = {BUDGET}\ntrusted_proxies = ["127.0.0.1/32"]\nredis_url = "{redis.url}"\n'
    with sluice(tmp_path, config) as server:
        key = default_team_key(server, "roaming", rpm=60)
        assert [unknown_model(server, key, "10.4.0.1").status_code for _ in range(BUDGET)] == [404] * BUDGET
    with sluice(tmp_path, config) as server:
        assert_budget_refusal(unknown_model(server, key, "10.4.0.2"))


@pytest.mark.parametrize("value", [0, -1, "many"])
def test_the_budget_setting_refuses_a_value_that_would_refuse_every_refusal(tmp_path, value):
    config = tmp_path / "sluice.toml"
    config.write_text(f"rejections_per_minute = {value!r}\n".replace("'", '"'))
    with pytest.raises(SystemExit, match="rejections_per_minute"):
        load_settings(str(config))


def test_a_worker_refusal_after_a_wait_in_the_queue_still_counts(tmp_path):
    """A stream that waited in the endpoint's queue past the keep-alive interval (10 s) has its 200 sent; the worker's
    refusal of what it is then comes as the stream's error event, and still counts against the budget (it did not: a
    team queued behind its own requests had the worker tokenize and refuse its prompts for free)."""
    from testkit.admin import admin
    from testkit.protocol_worker import MODEL as STUB
    from testkit.protocol_worker import Reply, protocol_worker, tokens
    from testkit.sluice import running_sluice

    admin_key = "rejection-budget-admin-key-0123456789abcdef"
    config = (f'rejections_per_minute = {BUDGET}\ntrusted_proxies = ["127.0.0.1/32"]\ndefault_team_limits = {{}}\n'
              f'[[models]]\nname = "{STUB}"\nmax_batch_size = 1\nmax_queue = 0\ntarget_concurrency = 0.5\n'
              'provisioner = { kind = "static", urls = ["{url}"] }\n')  # one request at a time: the rest queue
    with protocol_worker() as worker, running_sluice(tmp_path / "data", config=config.replace("{url}", worker.url),
                                                     env={"SLUICE_ADMIN_KEY": admin_key}) as server:
        team = admin(server, "POST", "/admin/teams", name="queued")["id"]
        key = admin(server, "POST", "/admin/keys", name="queued", team_id=team)["key"]
        headers = {"authorization": f"Bearer {key}"}
        worker.release.clear()
        worker.replies = [Reply(tokens("a b c"), hold_after=1),
                          Reply.refused(422, "validation", "token id 99999 is outside the vocabulary")]
        holder = threading.Thread(target=lambda: httpx.post(
            f"{server.url}/v1/completions", json={"model": STUB, "prompt": "a", "max_tokens": 3}, timeout=120,
            headers={**headers, "x-forwarded-for": "10.7.0.1"}))
        holder.start()
        while worker.generate_calls < 1:
            threading.Event().wait(0.01)
        waited, events = threading.Barrier(BUDGET + 1), []

        def queued(index: int) -> None:
            with httpx.stream("POST", f"{server.url}/v1/completions", timeout=120, json={
                    "model": STUB, "prompt": "a", "max_tokens": 3, "stream": True},
                    headers={**headers, "x-forwarded-for": f"10.7.1.{index}"}) as answer:
                chunks = answer.iter_bytes()
                first = next(chunks)  # the keep-alive: this stream waited past the interval, its 200 is out
                waited.wait()
                events.append((answer.status_code, first + b"".join(chunks)))

        streams = [threading.Thread(target=queued, args=(index,)) for index in range(BUDGET)]
        for thread in streams:
            thread.start()
        try:
            waited.wait(timeout=120)
        finally:
            worker.release.set()
            holder.join(timeout=120)
            for thread in streams:
                thread.join(timeout=120)
        assert len(events) == BUDGET and all(status == 200 and b"outside the vocabulary" in body
                                             for status, body in events), events
        after = post(server, "/v1/completions", {"model": STUB, "prompt": "a", "max_tokens": 3, "stream": True},
                     key, "10.7.2.1")  # no wait now: refused before any header, as any refusal past the budget
        assert_budget_refusal(after)
