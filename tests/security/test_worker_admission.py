"""Tenant <-> worker: what a tenant can make a worker compute before admission is bounded by what admission reserves,
a refusal costs the tenant wherever it happens, and the work before the engine is shared in tenants' turns (issue
#43, items 2, 3 and 9).

On main: 400k prompt ids were embedded (kilobytes a token) before the context check (+2 GB, billed nothing); a
prompt of megabytes was tokenized in full before it was refused, refusals at the worker were free of the rejection
budget (80 in a row, no 429), six long prompts held every thread that prepares generations and one tenant's
token counts held the worker's only tokenizer slot (another team's count: 5 ms -> 2.8 s).

Through `sluice serve` and a real worker process on a tiny random Llama with SmolLM2's tokenizer (8192 positions,
hidden size 512: an embedded prompt token is 2 KiB). The fairness checks assert an order (another tenant's call
ends while the attacker's calls still run), never a time; bench/attacks/worker_admission.py measures the times.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from testkit.admin import admin
from testkit.sluice import running_sluice
from testkit.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow
MODEL = "tiny/llama"
CONTEXT, HIDDEN = 8192, 512
BUDGET = 5  # rejections_per_minute
MANY_IDS = 200_000  # embedded on main: 200k x 512 float32 = 400 MiB
GROWTH_LIMIT = 64 << 20  # what the worker may grow by while it reads and refuses them (the body's ints: ~10 MiB)
WORDS = "the quick brown fox jumps over the lazy dog near a river bank. "  # about 4.4 bytes a token
# ten calls of one team at once, at least STILL_RUNNING of them unfinished when another team's call goes out, of
# which that call waits for at most AT_MOST_ENDED (on main: 5 of the chats, every one of the counts)
ATTACKERS, STILL_RUNNING, AT_MOST_ENDED = 10, 4, 2


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("worker-admission")
    tiny = write_tiny_model(root / "tiny", positions=CONTEXT, hidden_size=HIDDEN)
    config = (f'rejections_per_minute = {BUDGET}\ntrusted_proxies = ["127.0.0.1/32"]\ndefault_team_limits = {{}}\n'
              f'[[models]]\nname = "{MODEL}"\nsource = "{tiny}"\nquantization = "none"\ndtype = "float32"\n'
              f'threads = 1\ndecode_threads = 1\nmax_batch_size = 8\nmax_context = {CONTEXT}\n')
    with running_sluice(root / "data", config=config, env={"SLUICE_LOG_FORMAT": "json"}) as running:
        yield running


def team_key(server, name: str) -> str:
    team = admin(server, "POST", "/admin/teams", name=name)
    return admin(server, "POST", "/admin/keys", name=f"{name}-key", team_id=team["id"])["key"]


def post(server, path: str, body: dict, key: str, client: str) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=300,
                      headers={"authorization": f"Bearer {key}", "x-forwarded-for": client})


@contextlib.contextmanager
def peak_growth(pid: int) -> Iterator[dict]:
    """How far the process's resident memory rose above where it was, at its peak (VmHWM, reset first)."""
    before = psutil.Process(pid).memory_info().rss
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak starts again from now
    grown: dict = {}
    yield grown
    peak_kib = int(re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text()).group(1))
    grown["bytes"] = peak_kib * 1024 - before


def many_ids() -> dict:
    ids = [100 + i % 40_000 for i in range(MANY_IDS)]
    # Friendli's embedding replacement: on main the whole prompt was embedded to replace one position
    return {"token_index_to_replace": [0], "embedding_to_replace": [0.5] * HIDDEN, "ids": ids}


def test_a_prompt_of_many_ids_is_refused_by_the_worker_before_it_is_embedded(server):
    extra = many_ids()
    body = {"request_id": "many-ids", "model": MODEL, "prompt_ids": extra["ids"], "params": {"max_tokens": 4},
            "token_index_to_replace": extra["token_index_to_replace"],
            "embedding_to_replace": extra["embedding_to_replace"]}
    with peak_growth(server.worker_pids()[-1]) as grown:
        answer = httpx.post(f"{server.worker_url()}/generate", json=body, headers=server.worker_headers(), timeout=300)
    assert answer.status_code == 422 and answer.json()["kind"] == "too_long", answer.text[:300]
    assert f"{MANY_IDS} tokens" in answer.json()["message"]
    assert grown["bytes"] < GROWTH_LIMIT, f"the worker grew by {grown['bytes'] >> 20} MiB"


def test_the_gateway_refuses_token_ids_the_context_cannot_hold(server):
    key = team_key(server, "ids")
    extra = many_ids()
    body = {"model": MODEL, "prompt": extra["ids"], "max_tokens": 4,
            "token_index_to_replace": extra["token_index_to_replace"],
            "embedding_to_replace": extra["embedding_to_replace"]}
    with peak_growth(server.worker_pids()[-1]) as grown:
        answer = post(server, "/v1/completions", body, key, "10.8.0.1")
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded" and str(MANY_IDS) in error["message"]
    assert grown["bytes"] < GROWTH_LIMIT, f"the worker grew by {grown['bytes'] >> 20} MiB"


def test_a_text_the_context_cannot_hold_is_refused_by_its_size_without_tokenizing(server):
    """More than 8192 x 82 bytes (SmolLM2's longest token is 81 bytes) is more than 8192 tokens: refused from its
    size, at the gateway (a text prompt) and at the worker (a chat, which the worker's template lays out), with no
    token count, which only tokenizing it all could give (on main: 6-14 s of a worker for a 4 MB prompt)."""
    key = team_key(server, "big-text")
    text = WORDS * (700_000 // len(WORDS))
    answer = post(server, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 4}, key, "10.8.0.2")
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    assert "bytes, at least" in answer.json()["error"]["message"]

    chat = {"request_id": "big-chat", "model": MODEL, "messages": [{"role": "user", "content": text}]}
    answer = httpx.post(f"{server.worker_url()}/generate", json=chat, headers=server.worker_headers(), timeout=300)
    assert answer.status_code == 422 and answer.json()["kind"] == "too_long", answer.text[:300]
    assert answer.json()["prompt_tokens"] is None and "bytes, at least" in answer.json()["message"]


def test_context_overflows_refused_by_the_worker_count_against_the_rejection_budget(server):
    """A chat of 100 KB (about 23k tokens: under the size bound, over the context) is tokenized by the worker and
    refused there; each refusal counts like one at the gateway, so the sixth in a minute is a 429."""
    key = team_key(server, "overflows")
    chat = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": WORDS * 1600}]}
    answers = [post(server, "/v1/chat/completions", chat, key, f"10.8.1.{i}") for i in range(BUDGET + 3)]
    for answer in answers[:BUDGET]:
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded", answer.text
    for answer in answers[BUDGET:]:
        assert answer.status_code == 429, answer.text[:300]
        assert "rejected requests" in answer.json()["error"]["message"]
        assert float(answer.headers["retry-after"]) > 0


def test_refused_token_counts_count_against_the_rejection_budget(server):
    key = team_key(server, "counts")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x " * 150_000}]}  # over /tokenize's bound
    answers = [post(server, "/v1/messages/count_tokens", body, key, f"10.8.2.{i}") for i in range(BUDGET + 3)]
    assert all(a.status_code == 400 for a in answers[:BUDGET]), [a.text[:200] for a in answers]
    for answer in answers[BUDGET:]:
        assert answer.status_code == 429, answer.text[:300]
        assert answer.json()["type"] == "error"  # Anthropic's envelope


def race(server, attack: tuple[str, dict], probe: tuple[str, dict]) -> tuple[int, int]:
    """ATTACKERS calls of one team at once, then, while the worker has them, another team's call: how many of the
    attacker's calls had not ended when the other team's call went out, and how many ended while it waited."""
    tag = time.monotonic_ns()
    attacker, victim = team_key(server, f"attacker-{tag}"), team_key(server, f"victim-{tag}")
    ended = threading.Semaphore(0)
    threads = [threading.Thread(target=lambda i=i: (post(server, *attack, attacker, f"10.9.0.{i}"), ended.release()))
               for i in range(ATTACKERS)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # the bodies reach the worker (not an assertion: a slower machine only adds attackers' work)
    before = sum(ended.acquire(blocking=False) for _ in range(ATTACKERS))
    answer = post(server, *probe, victim, "10.9.1.1")
    during = sum(ended.acquire(blocking=False) for _ in range(ATTACKERS))
    for thread in threads:
        thread.join(timeout=600)
    assert answer.status_code == 200, answer.text[:300]
    return ATTACKERS - before, during


def test_another_teams_chat_is_prepared_while_one_team_tokenizes_long_prompts(server):
    """Ten chats of 600 KB (under the size bound, each tokenized in full, then refused as too long) and another
    team's short chat: it is prepared in its own turn, not after the ten (on main: after five, in the shared pool)."""
    attack = ("/v1/chat/completions", {"model": MODEL, "max_tokens": 4,
                                       "messages": [{"role": "user", "content": WORDS * (600_000 // len(WORDS))}]})
    probe = ("/v1/chat/completions", {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    running, ended_meanwhile = race(server, attack, probe)
    assert running >= STILL_RUNNING  # the attack was on when the chat came (else this proves nothing)
    assert ended_meanwhile <= AT_MOST_ENDED, (running, ended_meanwhile)


def test_another_teams_token_count_is_not_queued_behind_one_teams_counts(server):
    """Ten token counts of 250k characters and another team's count of a short chat (on main: one semaphore per
    worker, so it waited for every count before it)."""
    attack = ("/v1/messages/count_tokens", {"model": MODEL,
                                            "messages": [{"role": "user", "content": WORDS * (250_000 // len(WORDS))}]})
    probe = ("/v1/messages/count_tokens", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    running, ended_meanwhile = race(server, attack, probe)
    assert running >= STILL_RUNNING  # the attack was on when the count came (else this proves nothing)
    assert ended_meanwhile <= AT_MOST_ENDED, (running, ended_meanwhile)


@pytest.mark.parametrize("text", ["\n" + " " * 80, "#" * 80, "<|im_start|>", "🙂", "a", " " * 81 + "x"])
def test_the_size_bound_never_refuses_a_text_that_fits(text, smol_tokenizer):
    """The bound behind the size refusals, on SmolLM2's tokenizer: a text of B bytes is at least B / max_token_bytes
    tokens, for texts made of its longest tokens, its special tokens and what is not one token."""
    from worker.token_bytes import max_token_bytes

    most = max_token_bytes(smol_tokenizer)
    sample = text * 500
    assert len(smol_tokenizer(sample, add_special_tokens=False).input_ids) * most >= len(sample.encode())


def test_a_truncated_prompt_keeps_the_tokens_of_the_whole_text(smol_tokenizer):
    """Under `truncate` the worker tokenizes only the text's tail: the tokens it keeps are those of the whole."""
    from worker.engine.prompt_tokens import text_ids
    from worker.token_bytes import max_token_bytes

    text = "Ünïcode and words, " * 40_000
    kept = text_ids(smol_tokenizer, text, add_special_tokens=True, max_context=CONTEXT, truncate=100,
                    max_token_bytes=max_token_bytes(smol_tokenizer), field="prompt")[-100:]
    assert kept == smol_tokenizer(text).input_ids[-100:]
