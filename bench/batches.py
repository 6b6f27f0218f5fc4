"""Batches beside interactive load (#48): what a batch costs interactive requests, and how much of the capacity
they leave idle it uses. One `sluice serve` with the real model, three phases in one run:

    .venv/bin/python bench/batches.py [--quick] [--streams 16] [--seconds 30] [--lines 10000] [--tokens 32]

- interactive alone: `--streams` closed-loop streaming chat requests for `--seconds`: TTFT p50 / p99, output tok/s;
- saturated: `--streams` + `[batches] in_flight_per_endpoint` interactive streams: the engine's output tok/s with
  as many rows as the two loads together keep busy;
- interactive + batch: the same `--streams` beside a `--lines` batch (cancelled at the end): TTFT p99 and both
  loads' output tok/s (the batch's from its `usage`).
Prints the TTFT p99 ratio (with batch / alone; the issue's bar: <= 1.2) and the batch's share of the idle
capacity, (interactive + batch) / saturated (bar: >= 0.8), and batch / (saturated - interactive alone).
No assertions. `--quick` (or SLUICE_BENCH_QUICK=1): 4 streams, 10 s phases, 400 lines.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai  # noqa: E402

from bench.harness.stats import percentile  # noqa: E402
from testkit.sluice import MODEL, running_sluice  # noqa: E402

IN_FLIGHT = 8


def stream_load(url: str, key: str, streams: int, seconds: float, tokens: int) -> tuple[list[float], int]:
    """`streams` closed-loop streaming chat requests for `seconds`: (TTFTs in s, output tokens)."""
    ttfts: list[float] = []
    produced = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def one_stream(number: int) -> None:
        with httpx.Client(timeout=300, headers={"authorization": f"Bearer {key}"}) as client:
            turn = 0
            while time.monotonic() < stop:
                turn += 1
                body = {"model": MODEL, "stream": True, "max_tokens": tokens, "stream_options": {"include_usage": True},
                        "messages": [{"role": "user", "content": f"Stream {number}, turn {turn}: tell me a story."}]}
                started, first = time.monotonic(), None
                with client.stream("POST", f"{url}/v1/chat/completions", json=body) as answer:
                    for line in answer.iter_lines():
                        if not line.startswith("data: {"):
                            continue
                        chunk = json.loads(line[6:])
                        if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                            first = time.monotonic() - started
                        if chunk.get("usage"):
                            with lock:
                                produced[0] += chunk["usage"]["completion_tokens"]
                if first is not None:
                    with lock:
                        ttfts.append(first)

    threads = [threading.Thread(target=one_stream, args=(n,)) for n in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ttfts, produced[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", default=os.environ.get("SLUICE_BENCH_QUICK") == "1")
    parser.add_argument("--streams", type=int)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--lines", type=int)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    streams = args.streams or (4 if args.quick else 16)
    seconds = args.seconds or (10.0 if args.quick else 30.0)
    lines = args.lines or (400 if args.quick else 10_000)
    config = (f'default_team_limits = {{}}\n[batches]\npoll_interval_s = 0.2\nin_flight_per_endpoint = {IN_FLIGHT}\n'
              f'max_file_lines = {max(lines, 1)}\n')
    with tempfile.TemporaryDirectory() as data, running_sluice(Path(data), config=config) as server:
        key = server.api_key
        stream_load(server.url, key, streams, 3.0, args.tokens)  # warm-up
        alone, alone_tokens = stream_load(server.url, key, streams, seconds, args.tokens)
        _, saturated_tokens = stream_load(server.url, key, streams + IN_FLIGHT, seconds, args.tokens)
        api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=2, timeout=300)
        body = b"".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
            "model": MODEL, "max_tokens": args.tokens,
            "messages": [{"role": "user", "content": f"Item {i}: write one sentence."}]}}).encode() + b"\n"
            for i in range(lines))
        file_id = api.files.create(file=("bench.jsonl", io.BytesIO(body)), purpose="batch").id
        batch = api.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        time.sleep(3.0)  # the batch is running
        before = api.batches.retrieve(batch.id).usage.output_tokens
        window = time.monotonic()
        together, together_tokens = stream_load(server.url, key, streams, seconds, args.tokens)
        elapsed = time.monotonic() - window
        batch_tokens = api.batches.retrieve(batch.id).usage.output_tokens - before
        api.batches.cancel(batch.id)
    alone_rate, saturated_rate = alone_tokens / seconds, saturated_tokens / seconds
    interactive_rate, batch_rate = together_tokens / elapsed, batch_tokens / elapsed
    p99_alone, p99_together = percentile(alone, 0.99), percentile(together, 0.99)
    print(f"interactive alone ({streams} streams): TTFT p50 {percentile(alone, 0.5) * 1000:.0f} ms, "
          f"p99 {p99_alone * 1000:.0f} ms, {alone_rate:.1f} tok/s")
    print(f"saturated ({streams + IN_FLIGHT} streams): {saturated_rate:.1f} tok/s")
    print(f"interactive + batch: TTFT p50 {percentile(together, 0.5) * 1000:.0f} ms, p99 {p99_together * 1000:.0f} ms,"
          f" interactive {interactive_rate:.1f} tok/s, batch {batch_rate:.1f} tok/s")
    print(f"TTFT p99 ratio (with batch / alone): {p99_together / p99_alone:.2f}   (bar <= 1.2)")
    print(f"both loads / saturated: {(interactive_rate + batch_rate) / saturated_rate:.2f}   (bar >= 0.8)")
    idle = saturated_rate - alone_rate
    share = f"{batch_rate / idle:.2f}" if idle > 0 else "n/a (the saturated run was no faster: a loaded machine)"
    print(f"batch / idle capacity (saturated - interactive alone): {share}")


if __name__ == "__main__":
    main()
