"""Tenant <-> tenant through the token limits (issue 31, item 5): the reservation made before admission bounds
everything a request is charged, so adversarial bodies (tools, long system prompts, many messages, n, best_of,
beams) overrun neither tpm nor a monthly budget by more than 10 %.

Through `sluice serve` and a real worker on a tiny random Llama with SmolLM2's tokenizer and chat template (the
token counts are the real model's), with the ledger's records as the judge."""

from __future__ import annotations

import time
from datetime import datetime

import httpx
import pytest

from testkit.admin import admin
from testkit.sluice import GRAMMAR_COMPILE_LIMIT_S, running_sluice
from testkit.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow
MODEL = "tiny/llama"
TPM, BUDGET, TRIES = 1000, 300, 5


def tool(index: int) -> dict:
    return {"type": "function", "function": {
        "name": f"tool_{index}", "description": "Looks a thing up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}


def chat(messages: list[dict], **extra) -> dict:
    return {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0, **extra}


HI = [{"role": "user", "content": "hi"}]
MANY = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(90)] + HI
TOOLS = [tool(i) for i in range(14)]
# each about 600-750 prompt tokens that a count of the message text alone puts at a few dozen to a few hundred
SHAPES = {
    "tools": chat(HI, tools=TOOLS),
    "long system prompt": chat([{"role": "system", "content": " ".join(["ok"] * 600)}] + HI),
    "many messages": chat(MANY),
    "n": chat(HI, tools=TOOLS, n=4, temperature=0.7),
    "best_of": chat(HI, tools=TOOLS, best_of=4, temperature=0.7),
    "beams": chat(MANY, num_beams=4),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("reservation")
    tiny = write_tiny_model(root / "tiny", positions=8192)
    config = (f'[[models]]\nname = "{MODEL}"\nsource = "{tiny}"\nthreads = 1\ndecode_threads = 1\n'
              f'max_batch_size = 8\nmax_context = 8192\ngrammar_compile_timeout_s = {GRAMMAR_COMPILE_LIMIT_S}\n')
    with running_sluice(root / "data", config=config, env={"SLUICE_LOG_FORMAT": "json"}) as running:
        yield running


def team_key(server, name: str, **limits) -> tuple[str, str]:
    team = admin(server, "POST", "/admin/teams", name=name, limits=limits)
    return team["id"], admin(server, "POST", "/admin/keys", name=f"{name}-key", team_id=team["id"])["key"]


def send(server, key: str, body: dict) -> list[str]:
    """The body TRIES times, one after another; the request ids of the answers."""
    ids = []
    for _ in range(TRIES):
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120,
                            headers={"authorization": f"Bearer {key}"})
        assert answer.status_code in (200, 429), answer.text
        ids.append(answer.headers["x-request-id"])
    return ids


def charged(server, team_id: str, ids: list[str]) -> list[tuple[float, int]]:
    """(arrival, tokens charged) of the team's records, once all of `ids` are in the ledger."""
    deadline = time.monotonic() + 60  # records ship to the database in the background
    while True:
        records = [r for r in admin(server, "GET", "/admin/usage/records?limit=10000")["data"]
                   if r["team_id"] == team_id]
        if {r["request_id"] for r in records} >= set(ids) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {r["request_id"] for r in records} >= set(ids)
    return [(_seconds(r["time"]), r["prompt_tokens"] + r["compute_tokens"]) for r in records]


def _seconds(value) -> float:
    return value if isinstance(value, (int, float)) else datetime.fromisoformat(value).timestamp()


@pytest.mark.parametrize("tpm", [TPM, 4 * TPM])  # about one request's tokens (on main each overran it), and room
@pytest.mark.parametrize("shape", SHAPES)      # for several, where the bound must also let requests in
def test_no_minute_holds_more_than_tpm(server, shape, tpm):
    team_id, key = team_key(server, f"tpm-{tpm}-{shape.replace(' ', '-')}", tpm=tpm)
    records = charged(server, team_id, send(server, key, SHAPES[shape]))
    # every 60 s window, wherever it starts, as the limiter's sliding window counts them
    worst = max(sum(tokens for when, tokens in records if start <= when < start + 60) for start, _ in records)
    assert worst <= tpm * 1.1, (shape, records)
    if tpm > TPM:
        assert worst > 0  # the bound admitted some: a limit that refuses everything is no proof


@pytest.mark.parametrize("shape", ["tools", "many messages"])
def test_a_budget_is_not_overrun(server, shape):
    big = SHAPES[shape]
    team_id, key = team_key(server, f"budget-{shape.replace(' ', '-')}", monthly_token_budget=BUDGET)
    records = charged(server, team_id, send(server, key, big))
    assert sum(tokens for _, tokens in records) <= BUDGET * 1.1, (shape, records)


def test_an_ordinary_chat_still_fits(server):
    """The bound is loose (bytes, not tokens), not so loose that a small team's plain chat is refused."""
    team_id, key = team_key(server, "tpm-ordinary", tpm=TPM)
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=chat(HI), timeout=120,
                        headers={"authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    assert sum(tokens for _, tokens in charged(server, team_id, [answer.headers["x-request-id"]])) > 0


CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "tool_0", "arguments": '{"q": "7 7 7 7"}'}}]}
ODD = [
    [{"role": "user", "content": " ".join(str(i % 10) for i in range(2000))}],  # a token per byte or so
    [{"role": "system", "content": "日本語🙂é\n\t" * 200}, {"role": "user", "content": "\u00ad\u200b" * 300}],
    [{"role": "user", "content": [{"type": "text", "text": "a b " * 300}]}],
    [{"role": "user", "content": "x"}, CALL, {"role": "tool", "tool_call_id": "c1", "content": "1 2 3 " * 100}],
    [{"role": "u" * 500, "content": ""}] * 20,
]


@pytest.mark.parametrize("messages", ODD, ids=["digits", "unicode", "parts", "tool turns", "odd roles"])
@pytest.mark.parametrize("with_tools", [False, True])
def test_the_bound_holds_for_odd_chats_on_the_real_tokenizer(messages, with_tools, smol_tokenizer):
    """The prompt bound the gateway reserves against, next to the count the worker makes: SmolLM2's tokenizer and
    chat template rendering these chats, the template's overhead measured as a worker measures it at start."""
    from common.protocol import FunctionTool, GenerateRequest, ToolSpec
    from gateway.limits.tokens import prompt_bounds
    from worker.prompt_overhead import measure
    from worker.tools import render_chat

    tools = ToolSpec(functions=[FunctionTool(name=f"tool_{i}", description="Ü" * 50 + "数" * 50,
                                             parameters={"type": "object", "properties": {"q": {"enum": ["7"] * 40}}})
                                for i in range(3)], prompt="Use 1 2 3 tools. " * 20) if with_tools else None
    actual = len(smol_tokenizer(render_chat(smol_tokenizer, messages, tools, True), add_special_tokens=False).input_ids)
    request = GenerateRequest(request_id="r", model=MODEL, messages=messages, tools=tools)
    assert prompt_bounds(request, measure(smol_tokenizer))[1] >= actual


def test_the_bound_holds_for_chat_template_variables_printed_per_message(smol_tokenizer):
    """chat_template_kwargs (issue #49 item 5) reach the prompt as the template prints them: a template that prints
    one in every turn and once more (the most a template of a served model does) stays within the reserved bound."""
    import copy

    from common.protocol import GenerateRequest
    from gateway.limits.tokens import prompt_bounds
    from worker.prompt_overhead import measure
    from worker.tools import render_chat

    overhead = measure(smol_tokenizer)
    twin = copy.deepcopy(smol_tokenizer)
    twin.chat_template = "{{ note }}{% for m in messages %}[{{ note }}{{ m.content }}]{% endfor %}{{ flag }}"
    messages = [{"role": "user", "content": "x"}] * 8
    kwargs = {"note": " ".join(str(i % 10) for i in range(500)), "flag": True}  # about a token per byte
    actual = len(twin(render_chat(twin, messages, None, True, template_kwargs=kwargs),
                      add_special_tokens=False).input_ids)
    request = GenerateRequest(request_id="r", model=MODEL, messages=messages, chat_template_kwargs=kwargs)
    assert prompt_bounds(request, overhead)[1] >= actual
