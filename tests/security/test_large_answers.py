"""A large collected answer costs the gateway's event loop only I/O (issue #43 item 12).

An answer of `n` = 32 with 20 top logprobs a token (12 MiB of JSON) took a second of the event loop that every
team's streams and `/livez` share: the relay decoded its 9,600 token events there, then a thread rendered them,
sharing the loop's GIL. Now the relay passes token lines on undecoded (gateway/replicas/token_lines.py) and the
answer is decoded, rendered and encoded in the render process (gateway/serving/render_process.py), in its team's
turn. Checked here on the same worker events as the path before it: the same bytes in every dialect that asks
for logprobs of several choices; the loop's turns while a large answer renders, counted, not timed; the team's
turns and bound. bench/attacks/worker_fairness.py (`--attacks answers`) measures `/livez` beside such answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import multiprocessing
import os
import re
import signal
import socket
import threading

import httpx
import msgspec
import pytest

from common.protocol import (
    Accepted,
    Done,
    Finish,
    GenerateRequest,
    SamplingParams,
    Token,
    TopLogprob,
    decode_event,
    encode_event,
)
from gateway.config import Settings
from gateway.dialects.fast_path import BODY_PIECE, send_body
from gateway.dialects.openai.chat import OpenAIChat
from gateway.dialects.openai.completions import OpenAICompletions
from gateway.dialects.responses.dialect import OpenAIResponses
from gateway.dialects.sglang.dialect import SGLang
from gateway.dialects.tgi.dialect import TGI
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from gateway.errors import UpstreamFailed
from gateway.replicas.pool import Replica
from gateway.replicas.relay import attempt
from gateway.replicas.token_lines import TokenLines, split_lines, token_runs
from gateway.serving.answer_body import answer_body, off_loop
from gateway.serving.collect import Result
from gateway.serving.dialect import Meta
from gateway.serving.render_process import (
    RENDERER,
    WAITING_PER_OWNER,
    AnswerRenderer,
    LargeAnswersBusy,
    bulk_socket,
    receive_exactly,
    run_job,
)
from testkit.admin import default_team_key
from testkit.protocol_worker import MODEL as STUB_MODEL
from testkit.protocol_worker import Reply, protocol_worker, sluice_on_protocol_worker
from tests.gateway.app_client import ADMIN_KEY, app_client

CHOICES, TOKENS, TOP = 32, 40, 20
META = Meta("r1", 1, "m")
TURNS_WHILE_HELD = 100_000  # the loop's turns counted while the render process is stopped
_LATENCY = re.compile(rb'"e2e_latency":[0-9.e-]+')  # SGLang's time since the request arrived: the one moving part


def timeless(body: bytes) -> bytes:
    return _LATENCY.sub(b'"e2e_latency":0', body)


def worker_events(choices: int = CHOICES, tokens: int = TOKENS, top: int = TOP) -> list:
    """What a worker sends for `choices` choices with `top` alternatives a token, the choices interleaved as a
    batch makes them (the order rendering must keep per choice)."""
    events: list = [Accepted(prompt_tokens=3, prompt_ids=[1, 2, 3], seeds=list(range(choices)))]
    for position in range(tokens):
        events += [Token(index=index, token_id=position, text=f" t{position}é", piece=f" t{position}é",
                         logprob=-0.5 - position / 7 - index, top_logprobs=[TopLogprob(k, -1.25 - k, f" alt{k}")
                                                                              for k in range(top)])
                   for index in range(choices)]
    events += [Finish(index=index, reason="length", text="".join(f" t{p}é" for p in range(tokens)),
                      token_ids=list(range(tokens)), seed=index, cumulative_logprob=-index * 1.5)
               for index in range(choices)]
    events.append(Done(prompt_tokens=3, completion_tokens=choices * tokens, compute_tokens=choices * tokens))
    return events


def decoded(events: list) -> Result:
    """The Result of the path before: every event decoded on the loop."""
    result = Result()
    for event in events:
        result.add(event)
    return result


def as_relayed(events: list, lines_a_read: int = 100) -> Result:
    """The Result the relay makes now of the same events: the token lines undecoded and uncut, read
    `lines_a_read` lines at a time (as `attempt` takes them: `token_runs` of each block)."""
    result = Result()
    lines = [encode_event(event) for event in events]
    for start in range(0, len(lines), lines_a_read):
        for item in token_runs(b"".join(lines[start:start + lines_a_read])):
            result.add(item if isinstance(item, TokenLines) else msgspec.json.decode(item, type=type(
                next(e for e in events if encode_event(e)[:-1] == item))))
    return result


# every dialect that asks for logprobs of several choices, and the Responses API (one choice, rendered in a thread)
DIALECTS = {
    "chat": (OpenAIChat(), "/v1/chat/completions",
             {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "n": CHOICES, "logprobs": True,
              "top_logprobs": TOP, "max_tokens": TOKENS}, CHOICES),
    "friendli chat": (OpenAIChat(friendli=True), "/v1/chat/completions",
                      {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "n": CHOICES, "logprobs": True,
                       "top_logprobs": TOP, "max_tokens": TOKENS}, CHOICES),
    "completions": (OpenAICompletions(), "/v1/completions",
                    {"model": "m", "prompt": "Hi", "n": CHOICES, "logprobs": 5, "max_tokens": TOKENS}, CHOICES),
    "tgi": (TGI(100, stream=False), "/generate",
            {"inputs": "Hi", "parameters": {"best_of": 2, "do_sample": True, "details": True, "top_n_tokens": 5,
                                            "max_new_tokens": TOKENS}}, 2),
    "sglang": (SGLang(), "/generate",
               {"text": "Hi", "sampling_params": {"n": CHOICES, "max_new_tokens": TOKENS}, "return_logprob": True,
                "top_logprobs_num": TOP}, CHOICES),
    "responses": (OpenAIResponses(), "/v1/responses",
                  {"model": "m", "input": "Hi", "top_logprobs": TOP, "include": ["message.output_text.logprobs"],
                   "max_output_tokens": 4 * TOKENS}, 1),
}


@pytest.mark.parametrize("name", DIALECTS)
async def test_a_large_answer_renders_the_same_bytes_as_before(name):
    """The same worker events give the same body byte for byte: decoded on the loop and rendered there (the path
    before), and relayed undecoded then built in the render process (or the Responses API's thread)."""
    dialect, route, body, choices = DIALECTS[name]
    tokens = TOKENS if choices > 1 else 4 * TOKENS
    events = worker_events(choices, tokens)
    parsed = dialect.parse(body, route)
    before = msgspec.json.encode(dialect.render(parsed, [decoded(events)], META))
    relayed = as_relayed(events)
    assert relayed.pieces and off_loop([relayed]), "the answer is not large enough to leave the loop"
    assert timeless(await answer_body(dialect, parsed, [relayed], META, "team:a")) == timeless(before)
    small = as_relayed(worker_events(choices, 2, 2))  # built on the loop, from lines too
    assert not off_loop([small])
    assert timeless(await answer_body(dialect, parsed, [small], META, "team:a")) == timeless(msgspec.json.encode(
        dialect.render(parsed, [decoded(worker_events(choices, 2, 2))], META)))


def test_token_lines_pass_on_uncut_and_other_events_are_cut_out():
    """A block of token lines alone is passed on as it came, the same bytes object (no line cut out of it); a block
    with another event in it gives that event's line on its own, between the runs of token lines around it."""
    events = worker_events(2, 3, 2)
    tokens = b"".join(encode_event(event) for event in events if isinstance(event, Token))
    [run] = token_runs(tokens)
    assert isinstance(run, TokenLines) and run.piece is tokens and run.count == 6
    assert [decode_event(line) for line in split_lines(run.piece)] == [e for e in events if isinstance(e, Token)]
    accepted, finish = encode_event(events[0]), encode_event(events[-3])
    first, second = tokens[:tokens.index(b"\n") + 1], tokens[tokens.index(b"\n") + 1:]
    items = token_runs(accepted + first + finish + second + b"\n")
    assert [type(item) for item in items] == [bytes, TokenLines, bytes, TokenLines, bytes]
    assert (items[0], items[2], items[4]) == (accepted[:-1], finish[:-1], b"")
    assert (items[1].piece, items[1].count, items[3].piece, items[3].count) == (first, 1, second, 5)
    assert token_runs(b"") == []


async def test_the_loop_takes_a_turn_between_any_two_pieces_of_a_relayed_answer():
    """Counted, not timed: a worker's large answer reaches the relay in bursts of hundreds of lines; another task
    takes a turn of the loop between any two pieces the relay hands on (each piece what one burst brought, whole
    token lines), and the pieces are the worker's token lines, byte for byte."""
    events = worker_events()
    with protocol_worker() as worker:
        worker.replies = [Reply(events)]
        pieces = []
        request = GenerateRequest(request_id="r1", model=STUB_MODEL, prompt="Hi", params=SamplingParams(max_tokens=40))
        async with LoopTurns() as turns:
            async for item in attempt(Replica(worker.url), msgspec.json.encode(request), raw_tokens=True):
                if isinstance(item, TokenLines):
                    pieces.append((turns.count, item))
    assert len(pieces) > 1, "the answer came in one piece: nothing to check"
    assert all(before < after for (before, _), (after, _) in zip(pieces, pieces[1:])), [t for t, _ in pieces]
    assert b"".join(item.piece for _, item in pieces) == b"".join(encode_event(e) for e in events
                                                                  if isinstance(e, Token))
    assert sum(item.count for _, item in pieces) == CHOICES * TOKENS


async def test_a_large_body_is_written_in_pieces_the_loop_free_between_them():
    """A collected answer's body goes to the socket BODY_PIECE bytes at a time, views of the one body (no copies),
    another task taking a turn of the loop between any two writes; a small body is one write, as before."""
    body = bytes(range(256)) * (5 * BODY_PIECE // 256 + 7)
    writes = []
    async with LoopTurns() as turns:
        async def send(message) -> None:
            writes.append((turns.count, message))

        await send_body(send, body)
    assert len(writes) == 6 and all(len(m["body"]) <= BODY_PIECE for _, m in writes)
    assert b"".join(m["body"] for _, m in writes) == body
    assert [m["more_body"] for _, m in writes] == [True] * 5 + [False]
    assert all(before < after for (before, _), (after, _) in zip(writes, writes[1:])), [t for t, _ in writes]
    writes.clear()
    await send_body(send, b"{}")
    assert [m for _, m in writes] == [{"type": "http.response.body", "body": b"{}", "more_body": False}]


class LoopTurns:
    """Counted, not timed: the turns another task takes on the loop while the `async with` block runs."""

    def __init__(self) -> None:
        self.count, self._running = 0, True

    async def _take_turns(self) -> None:
        while self._running:
            self.count += 1
            await asyncio.sleep(0)

    async def __aenter__(self) -> LoopTurns:
        self._other = asyncio.create_task(self._take_turns())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *_) -> None:
        self._running = False
        await self._other


async def test_the_loop_keeps_its_turns_while_a_large_answer_renders():
    """Counted, not timed, and whatever else the host runs: with the render process stopped (SIGSTOP) while it has
    a large answer to build, the loop takes TURNS_WHILE_HELD turns and the answer is still pending; continued, it
    arrives, the same bytes as a thread builds. A thread (the path before, still the Responses API's) shares the
    loop's GIL: measured on a quiet host, 4-6k turns against 530k in the render process for the same answer."""
    chat, route, body, _ = DIALECTS["chat"]
    parsed = chat.parse(body, route)
    events = worker_events()
    await answer_body(chat, parsed, [as_relayed(events)], META, "team:warm")  # the child started
    in_thread = OpenAIChat()
    in_thread.renders_elsewhere = False  # as the Responses API's answers are built
    threaded_body = await answer_body(in_thread, parsed, [as_relayed(events)], META, "team:a")
    child = RENDERER.child
    assert child is not None and child.pid is not None and child.pid != os.getpid()
    os.kill(child.pid, signal.SIGSTOP)
    try:
        building = asyncio.create_task(answer_body(chat, parsed, [as_relayed(events)], META, "team:a"))
        async with LoopTurns() as turns:
            while turns.count < TURNS_WHILE_HELD and not building.done():
                await asyncio.sleep(0)
        assert not building.done() and turns.count >= TURNS_WHILE_HELD
    finally:
        os.kill(child.pid, signal.SIGCONT)
    child_body = await building
    assert child_body == threaded_body and RENDERER.child is child
    choices = json.loads(child_body)["choices"]
    assert len(choices) == CHOICES and all(len(c["logprobs"]["content"]) == TOKENS for c in choices)


async def test_an_unreadable_token_line_is_the_workers_fault_not_a_crash():
    chat, route, body, _ = DIALECTS["chat"]
    parsed = chat.parse(body, route)
    for size in (2, TOKENS):  # on the loop, and in the render process
        relayed = as_relayed(worker_events(CHOICES, size))
        relayed.pieces.insert(0, b'{"type":"token","index":"not a number"}\n')
        with pytest.raises(UpstreamFailed, match="cannot read"):
            await answer_body(chat, parsed, [relayed], META, "team:a")


async def test_teams_take_turns_at_the_render_process_and_a_backlog_is_refused_before_the_worker():
    """One team's large answers wait behind its own: another team's waits for one render at most. A team with
    WAITING_PER_OWNER answers waiting gets 429 large_answers_busy for its next collected request (the pipeline
    asks `check` before a worker is asked), the other team none."""
    renderer = AnswerRenderer(waiting_per_owner=3)
    release, order = threading.Event(), []

    def job(name: str):
        def work() -> str:
            if name == "a0":
                release.wait(60)
            order.append(name)
            return name
        return work

    first = asyncio.create_task(renderer.turns.run("team:a", job("a0")))
    while renderer.turns.waiting("team:a") or not renderer.turns.thread_ident:
        await asyncio.sleep(0.01)  # a0 runs
    queued = [asyncio.create_task(renderer.turns.run("team:a", job(f"a{i}"))) for i in (1, 2, 3)]
    await asyncio.sleep(0)
    with pytest.raises(LargeAnswersBusy) as refused:
        renderer.check("team:a")
    assert refused.value.status == 429 and refused.value.code == "large_answers_busy"
    renderer.check("team:b")
    other = asyncio.create_task(renderer.turns.run("team:b", job("b0")))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, *queued, other)
    assert order.index("b0") <= 2, order  # after a0 (running) and at most one of a's waiting answers
    renderer.check("team:a")


async def test_the_render_process_is_not_the_gateways_and_a_dead_one_is_replaced():
    """Where the work runs: a child at a lower priority than the gateway; one that died is started afresh and the
    answer still comes."""
    chat, route, body, _ = DIALECTS["chat"]
    parsed = chat.parse(body, route)
    events = worker_events()
    expected = await answer_body(chat, parsed, [as_relayed(events)], META, "team:a")
    child = RENDERER.child
    assert child is not None and child.pid != os.getpid()
    assert os.getpriority(os.PRIO_PROCESS, child.pid) > os.getpriority(os.PRIO_PROCESS, 0)
    child.kill()
    child.join()
    assert await answer_body(chat, parsed, [as_relayed(events)], META, "team:a") == expected
    assert RENDERER.child is not None and RENDERER.child.pid != child.pid


def test_a_render_job_runs_no_cycle_collection_and_renders_the_same_bytes():
    """Counted, not timed: a job of the render process (`run_job`, here on a thread, a duplex pipe standing for the
    child's) makes tens of thousands of objects and starts no cycle collection; the collector is on again after it,
    and the body is the one rendering gives in this process."""
    chat, route, body, _ = DIALECTS["chat"]
    parsed = dataclasses.replace(chat.parse(body, route), requests=[])
    events = worker_events()
    relayed = as_relayed(events)
    child_end, our_end = multiprocessing.Pipe()
    child_bulk, our_bulk = bulk_socket(child_end), bulk_socket(our_end)
    collections, ran = [], []
    job = threading.Thread(target=lambda: ran.append(run_job(child_end, child_bulk)))

    def seen(phase: str, info: dict) -> None:
        if phase == "start" and threading.get_ident() == job.ident:
            collections.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        job.start()
        our_end.send((chat, parsed, [dataclasses.replace(relayed, pieces=[], line_bytes=0)],
                      [sum(map(len, relayed.pieces))], META))
        for piece in relayed.pieces:
            our_bulk.sendall(piece)
        verdict, size = our_end.recv()
        answer = receive_exactly(our_bulk, size)
        job.join()
    finally:
        gc.callbacks.remove(seen)
        for end in (child_end, our_end, child_bulk, our_bulk):
            end.close()
    assert verdict == "ok" and ran == [True]
    assert collections == [] and gc.isenabled()
    assert answer == msgspec.json.encode(chat.render(parsed, [decoded(events)], META))


def test_bytes_to_and_from_the_render_process_come_whole_or_not_at_all():
    """`receive_exactly` over the render process's socket: a message sent in parts arrives as one bytes object; an
    end that closes mid-message is EOFError, not a short answer."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        sender = threading.Thread(target=lambda: [theirs.sendall(part) for part in (b"x" * 70_000, b"y" * 30_000)])
        sender.start()
        assert receive_exactly(ours, 100_000) == b"x" * 70_000 + b"y" * 30_000
        sender.join()
        theirs.sendall(b"only part")
        theirs.shutdown(socket.SHUT_WR)
        with pytest.raises(EOFError):
            receive_exactly(ours, 100)


def test_a_large_answer_through_sluice_serve_is_whole_and_billed(tmp_path):
    """End to end: the worker's lines relayed undecoded, the answer built in the render process, the same body
    as the dialect renders from the decoded events, its usage whole."""
    events = worker_events()
    with sluice_on_protocol_worker(tmp_path, "large-answers-admin-key-0123456789abcdef",
                                   settings="default_team_limits = {}\n") as (server, worker):
        worker.replies = [Reply(events)]
        headers = {"authorization": f"Bearer {default_team_key(server, 'large')}"}
        body = {**DIALECTS["chat"][2], "model": STUB_MODEL}
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=300)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    chat = OpenAIChat()
    expected = chat.render(chat.parse(body, "/v1/chat/completions"), [decoded(events)],
                           Meta(got["id"].removeprefix("chatcmpl-"), got["created"], got["model"]))
    assert got == json.loads(msgspec.json.encode(expected))
    assert got["usage"]["completion_tokens"] == CHOICES * TOKENS


async def test_a_team_with_answers_waiting_is_refused_before_a_worker_is_asked(tmp_path):
    """Through the gateway's pipeline (the app in this process, the render process's turns its own): while a team
    has WAITING_PER_OWNER answers waiting for their turn, its next collected request is 429 large_answers_busy in
    its dialect's envelope and reaches no worker; once they are done it is served."""
    with protocol_worker() as worker:
        worker.replies = [Reply(worker_events(2, 2, 2))]
        settings = Settings(data_dir=str(tmp_path), admin_key=ADMIN_KEY,
                            models=[EndpointSpec(name=STUB_MODEL, provisioner=StaticProvisioning(urls=[worker.url]))])
        async with app_client(settings) as client:
            teams = (await client.get("/admin/teams", headers=client.admin_headers)).json()["data"]
            owner = "team:" + next(team["id"] for team in teams if team["name"] == "default")
            release = threading.Event()
            held = [asyncio.create_task(RENDERER.turns.run(owner, lambda: release.wait(60)))
                    for _ in range(WAITING_PER_OWNER + 1)]  # one running, the rest waiting
            while RENDERER.turns.waiting(owner) < WAITING_PER_OWNER:
                await asyncio.sleep(0.01)
            body = {"model": STUB_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
            try:
                refused = await client.post("/v1/chat/completions", json=body, headers=client.key_headers)
            finally:
                release.set()
                await asyncio.gather(*held)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "large_answers_busy" and "retry-after" in refused.headers
            assert worker.requests == []
            served = await client.post("/v1/chat/completions", json=body, headers=client.key_headers)
            assert served.status_code == 200, served.text
            assert len(worker.requests) == 1
