"""The lowest value of each worker setting is honoured by a real `sluice serve` (issue #49 item 6): `max_queue = 0`
("no request waits for a row") used to refuse every request, the worker's own warm-up included, so three replicas
crashed and the start failed after ~75 s; `max_context = 2` refused the warm-up's prompt the same way."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from testkit.sluice import running_sluice

pytestmark = pytest.mark.slow
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
LOWEST = (f'[[models]]\nname = "{MODEL}"\nquantization = "none"\ndtype = "float32"\nmax_queue = 0\n'
          "max_batch_size = 1\nmax_batched_tokens = 1\nthreads = 0\ndecode_threads = 0\nprefix_cache_bytes = 0\n"
          "grammar_cache_bytes = 0\nordinary_share_beside_beams = 0\nmax_context = {context}\n")


def _complete(server, prompt, max_tokens: int) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", headers={"Authorization": f"Bearer {server.api_key}"},
                      json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
                      timeout=180)


def test_no_worker_queue_serves_one_row_and_refuses_what_would_wait(tmp_path):
    with running_sluice(tmp_path, config=LOWEST.format(context=64)) as server:
        for i in range(3):  # one at a time: each finds the row free (old main: every one was "queue full")
            answer = _complete(server, f"Count to {i}:", 4)
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == 4
        with concurrent.futures.ThreadPoolExecutor(4) as pool:  # more than the one row: "no waiting" refuses
            answers = list(pool.map(lambda i: _complete(server, f"Count to {i}:", 8), range(4)))
        assert {a.status_code for a in answers} <= {200, 429} and 200 in {a.status_code for a in answers}
        refused = [a for a in answers if a.status_code == 429]
        assert all(a.json()["error"]["code"] == "overloaded" and a.headers.get("retry-after") for a in refused)


def test_the_smallest_context_starts_and_serves_one_token(tmp_path):
    with running_sluice(tmp_path, config=LOWEST.format(context=2)) as server:
        answer = _complete(server, [1], 1)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"] == {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2,
                                          **{k: v for k, v in answer.json()["usage"].items()
                                             if k not in ("prompt_tokens", "completion_tokens", "total_tokens")}}
