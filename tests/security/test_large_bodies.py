"""Network ↔ gateway: large request bodies cost the event loop nothing (issue #43, items 2 and 3).

On main the gateway decoded a 4 MiB body (400k token ids: tens of milliseconds of msgspec holding the GIL) and its
dialect converted the ids again, both on the event loop that every team's requests share; six clients sending
such bodies back to back put another team's chat far past twice its idle time. Now a body over
LARGE_BODY_BYTES is decoded and parsed on one thread of its own, in turns per team (round robin, a few waiting
each, then 429 before decoding), resting twice as long as each body took (common/large_bodies.py). Checked here
by where the work runs and in which order, never by time; `bench/fairness.py --attack admission` measures the
latency."""

from __future__ import annotations

import asyncio
import threading

import httpx
import msgspec
import pytest

from common.large_bodies import LARGE_BODY_BYTES, TURNS, LargeBodiesBusy, LargeBodyTurns
from gateway.dialects.openai.completions import OpenAICompletions
from testkit.unread_bodies import answer_unread
from tests.gateway.dashboard.served import ADMIN_KEY, served_gateway, settings_in


async def test_a_large_body_is_decoded_and_parsed_off_the_event_loop(tmp_path, monkeypatch):
    """The real gateway on this test's loop: a completion of 400k token ids (2.7 MB) is parsed on the large
    bodies' thread, a small one on the loop itself (where it costs less than a hand-over)."""
    parsed_on: list[int] = []
    parse = OpenAICompletions.parse

    def recording(self, payload, route):  # the real parse, noting which thread runs it
        parsed_on.append(threading.get_ident())
        return parse(self, payload, route)

    monkeypatch.setattr(OpenAICompletions, "parse", recording)
    loop_thread = threading.get_ident()
    big = {"model": "no-such-model", "prompt": [100 + i % 40_000 for i in range(400_000)], "max_tokens": 4}
    async with served_gateway(settings_in(tmp_path)) as served, httpx.AsyncClient(timeout=120) as client:
        headers = {"authorization": f"Bearer {ADMIN_KEY}"}
        for body in (big, {**big, "prompt": [1, 2, 3]}):  # both refused (404) once parsed
            answer = await client.post(f"{served.url}/v1/completions", json=body, headers=headers)
            assert answer.status_code == 404, answer.text[:300]
    assert len(httpx.Request("POST", "/", json=big).content) > LARGE_BODY_BYTES
    assert parsed_on == [TURNS.thread_ident, loop_thread] and TURNS.thread_ident != loop_thread


async def test_large_bodies_take_turns_per_owner_and_a_flood_is_refused_before_decoding():
    """One owner's queued bodies wait behind the other owner's next one (round robin), and its fifth waiting body
    is refused (429 `large_bodies_busy`) without being run."""
    turns = LargeBodyTurns(waiting_per_owner=4, rest_ratio=0.0)
    started, release, order = threading.Event(), threading.Event(), []

    def job(name: str):
        def work() -> str:
            if name == "a0":
                started.set()
                release.wait(60)  # holds the thread while the others queue
            order.append(name)
            return name
        return work

    first = asyncio.ensure_future(turns.run("team:a", job("a0")))
    while not started.is_set():  # the thread runs a0
        await asyncio.sleep(0.01)
    queued = [asyncio.ensure_future(turns.run("team:a", job(f"a{i}"))) for i in range(1, 5)]
    await asyncio.sleep(0)
    queued.append(asyncio.ensure_future(turns.run("team:b", job("b0"))))
    await asyncio.sleep(0)
    with pytest.raises(LargeBodiesBusy) as busy:
        await turns.run("team:a", job("a5"))
    assert busy.value.status == 429 and busy.value.code == "large_bodies_busy"
    release.set()
    assert await asyncio.gather(first, *queued) == ["a0", "a1", "a2", "a3", "a4", "b0"]
    assert order == ["a0", "a1", "b0", "a2", "a3", "a4"]  # b's waited for one of a's, not all; a5 never ran


async def test_a_large_bodys_refusal_is_the_callers():
    """What the work raises reaches its caller, and the thread goes on with the next body."""
    turns = LargeBodyTurns(rest_ratio=0.0)

    def refused() -> None:
        raise ValueError("not JSON")

    with pytest.raises(ValueError, match="not JSON"):
        await turns.run("key:k", refused)
    assert await turns.run("key:k", lambda: 42) == 42


async def test_a_body_that_would_wait_behind_its_owners_is_refused_unread_and_counted(tmp_path):
    """An owner with its large bodies waiting is refused the next one by its content-length, before a byte of it
    is read, and each such 429 counts against the key's rejection budget: a client that keeps sending is held
    (refused at authentication, gateway/serving/rejections.py) once it is spent. On main the gateway read
    every such body whole first, and never counted the 429."""
    settings = msgspec.structs.replace(settings_in(tmp_path), rejections_per_minute=3)
    async with served_gateway(settings) as served:
        caller = await served.app.state.auth.authenticate(f"Bearer {ADMIN_KEY}", None, "127.0.0.1")
        owner = f"team:{caller.team_id}"
        started, release = threading.Event(), threading.Event()
        holding = [asyncio.ensure_future(TURNS.run(owner, lambda: started.set() or release.wait(60)))]
        while not started.is_set():  # the thread runs the first; then four wait behind it
            await asyncio.sleep(0.01)
        holding += [asyncio.ensure_future(TURNS.run(owner, lambda: None)) for _ in range(4)]
        await asyncio.sleep(0)
        try:
            answers = [await answer_unread(served.url, ADMIN_KEY) for _ in range(5)]
        finally:
            release.set()
            await asyncio.gather(*holding)
    assert [status for status, _ in answers] == [429] * 5
    assert all(b"large_bodies_busy" in body for _, body in answers[:3])
    assert b"Too many rejected requests: at most 3" in answers[3][1]  # the budget spent: the key is held
    assert b"of this API key" in answers[4][1]

