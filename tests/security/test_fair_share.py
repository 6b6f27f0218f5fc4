"""Tenant <-> tenant on a shared replica, through the real `sluice serve`:

- `max_concurrency` counts sequences (prompts x n / best_of / beams), not requests: a 4-prompt request holds 4
  of a team's 4 slots (gateway/limits), so a team's many-prompt request cannot crowd out more of a replica than
  its cap allows; one larger than the cap runs alone;
- the worker admits waiting requests in tenants' fair turns (worker/engine/fair_turns.py): another team's
  request starts before the remaining prompts of a team that got there first (asserted as an order, not a time;
  bench/fairness.py measures the time to first token against idle);
- one request of `n` = every row no longer holds them all while another team waits: a row of it is parked for
  the newcomer (worker/engine/preemption.py; in engine steps, for `n`, `best_of` and beams, in
  tests/worker/engine/test_preemption.py);
- a large collected answer (`n` = 32 x 20 top logprobs) costs the gateway's event loop only I/O: in
  tests/security/test_large_answers.py.

Grammar compiles that hold no prepare thread, and per-team grammar caches, are in
tests/worker/grammar/test_fairness.py (a real engine and its HTTP app).
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from testkit.admin import admin
from testkit.protocol_worker import MODEL as STUB_MODEL
from testkit.protocol_worker import Reply, sluice_on_protocol_worker, tokens
from testkit.sluice import MODEL, running_sluice

ADMIN_KEY = "fair-share-admin-key-0123456789abcdef"


def team_key(server, name: str, limits: dict | None = None) -> dict[str, str]:
    team = admin(server, "POST", "/admin/teams", name=name, limits=limits)
    key = admin(server, "POST", "/admin/keys", name=f"{name}-key", team_id=team["id"])["key"]
    return {"authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def stub_served(tmp_path_factory):
    with sluice_on_protocol_worker(tmp_path_factory.mktemp("fair-share"), ADMIN_KEY,
                                   settings="default_team_limits = {}\n") as pair:
        yield pair


def test_concurrency_counts_every_prompt_of_a_request(stub_served):
    server, worker = stub_served
    headers = team_key(server, "four-slots", {"max_concurrency": 4})
    # each of the four streams is held after its first event until the refusal is seen (a stream that only
    # lasted a while could end first on a loaded machine)
    worker.release.clear()
    worker.replies = [Reply(tokens("a b c"), hold_after=1)]
    answers: list[httpx.Response] = []
    first = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{server.url}/v1/completions", json={"model": STUB_MODEL, "prompt": ["a", "b", "c", "d"], "max_tokens": 3},
        headers=headers, timeout=60)))
    seen = len(worker.requests)
    first.start()
    try:
        while len(worker.requests) < seen + 4:  # all four prompts reached the worker: four sequences in flight
            assert first.is_alive() or answers, "the four-prompt request ended before it was in flight"
            threading.Event().wait(0.01)
        refused = httpx.post(f"{server.url}/v1/completions", json={"model": STUB_MODEL, "prompt": "e"},
                             headers=headers, timeout=60)
        assert refused.status_code == 429, refused.text
        assert "4 of its 4 concurrent sequences" in refused.json()["error"]["message"]
    finally:
        worker.release.set()
        first.join(timeout=60)
    assert answers and answers[0].status_code == 200, answers
    worker.replies = [Reply(tokens("a"))]
    alone = httpx.post(f"{server.url}/v1/completions", json={"model": STUB_MODEL, "prompt": ["x"] * 6},
                       headers=headers, timeout=60)  # more sequences than the cap: admitted when nothing else runs
    assert alone.status_code == 200, alone.text


@pytest.mark.slow
def test_another_team_starts_before_the_remaining_prompts_of_a_big_request(tmp_path_factory):
    config = f'default_team_limits = {{}}\n[[models]]\nname = "{MODEL}"\nmax_batch_size = 2\nmax_context = 512\n'
    with running_sluice(tmp_path_factory.mktemp("fair-turns"), config=config,
                        env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as server:
        big, small = team_key(server, "big"), team_key(server, "small")
        started: set[int] = set()  # the big request's choices that have streamed a token
        ended = threading.Event()

        def big_request() -> None:
            body = {"model": MODEL, "prompt": [f"Count to {i}:" for i in range(16)], "max_tokens": 12,
                    "temperature": 0, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=big, timeout=300) as stream:
                for line in stream.iter_lines():
                    if line.startswith("data: {"):
                        started.update(choice["index"] for choice in json.loads(line[6:])["choices"])
            ended.set()

        thread = threading.Thread(target=big_request)
        thread.start()
        try:
            while not started:  # its first rows run: its other 14 prompts wait at the worker
                assert thread.is_alive(), "the big request ended before streaming"
                threading.Event().wait(0.01)
            answer = httpx.post(f"{server.url}/v1/completions", headers=small, timeout=300,
                                json={"model": MODEL, "prompt": "Hi", "max_tokens": 1, "temperature": 0})
            assert answer.status_code == 200, answer.text
            seen = len(started)
        finally:
            thread.join(timeout=300)
        assert ended.is_set() and len(started) == 16
        # first come, first served started all 16 before it; in turns it takes the first row that frees
        assert seen <= 4, f"the small request finished after {seen} of the big request's 16 prompts had started"


def test_another_team_gets_a_row_while_one_request_of_n_holds_every_row(tmp_path_factory):
    """One request of `n` = every row was never parked: another team waited until it ended (45.6 s). Now a row of
    it is parked for the newcomer, which ends while the wide request still streams (an order, not a time)."""
    config = f'default_team_limits = {{}}\n[[models]]\nname = "{MODEL}"\nmax_batch_size = 2\nmax_context = 512\n'
    with running_sluice(tmp_path_factory.mktemp("wide-request"), config=config,
                        env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as server:
        wide, quiet = team_key(server, "wide"), team_key(server, "quiet")
        streamed: list[int] = []  # the wide request's choices, one entry per token streamed
        ended = threading.Event()

        def wide_request() -> None:
            body = {"model": MODEL, "prompt": "Tell a long story:", "n": 2, "max_tokens": 300, "temperature": 1.0,
                    "seed": 3, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=wide, timeout=600) as stream:
                for line in stream.iter_lines():
                    if line.startswith("data: {"):
                        streamed.extend(choice["index"] for choice in json.loads(line[6:])["choices"])
            ended.set()

        thread = threading.Thread(target=wide_request)
        thread.start()
        try:
            while len(set(streamed)) < 2:  # both rows of the worker decode its two choices
                assert thread.is_alive(), "the wide request ended before streaming"
                threading.Event().wait(0.01)
            answer = httpx.post(f"{server.url}/v1/completions", headers=quiet, timeout=600,
                                json={"model": MODEL, "prompt": "Hi", "max_tokens": 1, "temperature": 0})
            assert answer.status_code == 200, answer.text
            assert not ended.is_set(), "the other team waited for the whole wide request"
        finally:
            thread.join(timeout=600)
        assert ended.is_set() and streamed.count(0) == streamed.count(1) > 300  # both choices whole (+ a finish chunk)
