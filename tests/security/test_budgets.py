"""Tenant <-> operator through budgets (issue 43, items 5 and 6; issue 44, "budget answers"): every budget, in
tokens or in money, has one source of truth that survives a restart (the ledger, which seeds the counters) and is
enforced by reservation, not by a cached sum. So a hard budget is never overrun, by concurrent requests or by one
client in series; a token budget spent before a restart of `sluice serve` is still spent after it, and its refusal
states the usage the ledger holds; the request whose settlement carries spend across an alert's threshold sends
that alert, with no further request.

Through the real `sluice serve` (SQLite ledger in a temporary data dir) in front of the protocol worker process
(no model loads), with the ledger's records as the judge."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from testkit.admin import admin, ledger_records
from testkit.protocol_worker import MODEL, worker_process
from testkit.sluice import SluiceServer, running_sluice
from testkit.webhook import webhook_server

ADMIN_KEY = "budgets-test-admin-key-" + "b" * 32
DOLLAR = 1_000_000
PRICES = "[pricing.models.default]\ninput = 1000000000000\noutput = 1000000000000\n"  # $1 a token


@contextlib.contextmanager
def served(data_dir: Path, token_delay: float = 0.0) -> Iterator[SluiceServer]:
    """`sluice serve` at $1 a token before a protocol worker that generates max_tokens tokens, one every
    `token_delay` seconds."""
    prices = data_dir.parent / "prices.toml"
    prices.write_text(PRICES)
    with worker_process(token_delay=token_delay, quiet=True) as worker:
        config = (f'pricing_file = "{prices}"\n[budget_alerts]\nallow_http_webhooks = true\ntimeout_s = 30.0\n'
                  'webhook_networks = ["127.0.0.0/8"]\n'  # the local webhook server: allowed here by the operator
                  f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{worker.url}"] }}\n')
        with running_sluice(data_dir, config=config, env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as server:
            yield server


def team_key(server: SluiceServer, name: str, **limits) -> tuple[str, str]:
    team = admin(server, "POST", "/admin/teams", name=name, limits=limits)["id"]
    return team, admin(server, "POST", "/admin/keys", name=f"{name}-key", team_id=team)["key"]


def complete(server: SluiceServer, key: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 4},
                      headers={"authorization": f"Bearer {key}"}, timeout=60)


def until_refused(server: SluiceServer, key: str, most: int = 60) -> tuple[list[str], httpx.Response]:
    """One request at a time until one is refused: the served requests' ids, and the refusal."""
    served_ids = []
    for _ in range(most):
        answer = complete(server, key)
        if answer.status_code != 200:
            return served_ids, answer
        served_ids.append(answer.headers["x-request-id"])
    raise AssertionError(f"never refused in {most} requests")


def team_records(server: SluiceServer, team_id: str, ids: list[str]) -> list[dict]:
    """The team's records once every one of `ids` is in the ledger (it ships them in the background)."""
    deadline = time.monotonic() + 60
    while True:
        records = [r for r in ledger_records(server) if r["team_id"] == team_id]
        if {r["request_id"] for r in records} >= set(ids) or time.monotonic() > deadline:
            assert {r["request_id"] for r in records} >= set(ids)
            return records
        time.sleep(0.2)


def quota_refusal(answer: httpx.Response) -> str:
    assert answer.status_code == 429, answer.text
    assert answer.json()["error"]["code"] == "insufficient_quota", answer.text
    return answer.json()["error"]["message"]


def says_used(message: str, used: int) -> bool:
    """Whether a token budget's refusal states `used` tokens used (main's wording or this one's)."""
    return re.search(rf"(\({used:,} used in |has used {used:,} of )", message) is not None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with served(tmp_path_factory.mktemp("budgets") / "data", token_delay=0.05) as running:
        yield running


def test_sixteen_concurrent_requests_never_overrun_a_hard_budget(server):
    """On main: all 16 admitted against a spend read once a second: 16 x $9 = $144 of a $38 budget."""
    team_id, key = team_key(server, "concurrent", spend_budget={"amount_micros": 38 * DOLLAR})
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: complete(server, key), range(16)))
    ids = [a.headers["x-request-id"] for a in answers if a.status_code == 200]
    for refused in (a for a in answers if a.status_code != 200):
        quota_refusal(refused)
    spent = sum(r["cost_micros"] for r in team_records(server, team_id, ids))
    assert ids and spent <= 38 * DOLLAR, (len(ids), spent)


def test_sixteen_concurrent_requests_never_overrun_a_token_budget(server):
    """The same race on a monthly token budget and on a key's budget under its team's: reservations, not a sum."""
    for name, limits, key_limits in (
            ("team-tokens", {"monthly_token_budget": 40}, {}),
            ("key-tokens", {"spend_budget": {"amount_micros": 1000 * DOLLAR}}, {"monthly_token_budget": 40})):
        team_id = admin(server, "POST", "/admin/teams", name=f"concurrent-{name}", limits=limits)["id"]
        key = admin(server, "POST", "/admin/keys", name="tokens-key", team_id=team_id, limits=key_limits)["key"]
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(complete, [server] * 16, [key] * 16))
        ids = [a.headers["x-request-id"] for a in answers if a.status_code == 200]
        for refused in (a for a in answers if a.status_code != 200):
            quota_refusal(refused)
        used = sum(r["prompt_tokens"] + r["compute_tokens"] for r in team_records(server, team_id, ids))
        assert ids and len(ids) < 16 and used <= 40, (limits, key_limits, len(ids), used)


def test_one_client_in_series_never_overruns_a_hard_budget(server):
    """On main: requests admitted while the ledger and the one-second cache lag carry the spend past $98."""
    team_id, key = team_key(server, "series", spend_budget={"amount_micros": 98 * DOLLAR})
    ids, refusal = until_refused(server, key)
    message = quota_refusal(refusal)
    assert "retry-after" not in refusal.headers and refusal.headers["x-should-retry"] == "false"
    spent = sum(r["cost_micros"] for r in team_records(server, team_id, ids))
    assert ids and spent <= 98 * DOLLAR, (len(ids), spent)
    assert f"{spent / DOLLAR:.2f} used in" in message, message  # the refusal states what the ledger holds


def test_the_request_that_crosses_a_threshold_sends_its_alert(server):
    """On main: a threshold was noticed when the next request was admitted, so the last request's crossing was
    never announced while no request followed."""
    with webhook_server() as hooks:
        team_id, key = team_key(server, "alerted", spend_budget={"amount_micros": 100 * DOLLAR,
                                                                 "webhook_url": hooks.url})
        ids = []
        while not ids or sum(r["cost_micros"] for r in team_records(server, team_id, ids)) < 50 * DOLLAR:
            answer = complete(server, key)
            assert answer.status_code == 200, answer.text
            ids.append(answer.headers["x-request-id"])
        deadline = time.monotonic() + 120  # no request follows the one that crossed 50 %
        while not hooks.received and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [json.loads(r.body)["threshold"] for r in hooks.received] == [50]
        assert json.loads(hooks.received[0].body)["spent_micros"] >= 50 * DOLLAR


def test_a_token_budget_spent_before_a_restart_is_spent_after_it(tmp_path):
    """Issue 43, item 5: on main the limiter counted the month in memory, so a key refused at its budget was
    served again after a restart (and ended at 70 of 40 while the refusal still said "used 35")."""
    data = tmp_path / "data"
    with served(data) as first:
        team_id, key = team_key(first, "restarted", monthly_token_budget=40)
        ids, refusal = until_refused(first, key)
        used = sum(r["prompt_tokens"] + r["compute_tokens"] for r in team_records(first, team_id, ids))
        assert ids and used <= 40
        assert says_used(quota_refusal(refusal), used), refusal.text
        # a hard budget in money too: one counter kind for both, seeded from the same ledger
        money_team, money_key = team_key(first, "restarted-money", spend_budget={"amount_micros": 30 * DOLLAR})
        money_ids, _ = until_refused(first, money_key)
        spent = sum(r["cost_micros"] for r in team_records(first, money_team, money_ids))
        assert money_ids and spent <= 30 * DOLLAR
    with served(data) as second:  # the same data dir: the same ledger
        after = complete(second, key)
        assert says_used(quota_refusal(after), used), after.text
        records = team_records(second, team_id, ids)
        assert sum(r["prompt_tokens"] + r["compute_tokens"] for r in records) == used  # nothing more was served
        money_after = complete(second, money_key)
        assert f"{spent / DOLLAR:.2f} used in" in quota_refusal(money_after), money_after.text
        assert sum(r["cost_micros"] for r in team_records(second, money_team, money_ids)) == spent
