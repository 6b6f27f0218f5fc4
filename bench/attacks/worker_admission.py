"""Another team's time to first token while one team attacks what a worker computes before admission (issue #43,
items 2, 3 and 9), same run.

    .venv/bin/python bench/attacks/worker_admission.py [--quick] [--probes N] [--attackers N]

One `sluice serve` with the default model (SmolLM2-135M, one worker). The quiet team sends `--probes` streamed
4-token chats one after another; its TTFT (request sent -> first chunk) p50 / p99 in each phase:
- idle: nothing else runs;
- many ids (item 2): `--attackers` clients of another team keep sending completions of 400k token ids with one
  embedding replaced (on main the worker embedded all of them, +2 GB, before the context check);
- 4 MB prompt (item 3): the same with a 4 MB text prompt (on main tokenized in full, 6-14 s, then refused);
- 300 KB chats (item 3): chats just under the size bound (`max_context x max_token_bytes`), so each is tokenized
  in full by the worker and refused there: the most a prompt can still cost;
- count_tokens (item 9): Anthropic token counts of 250k characters (on main one at a time per worker); here the
  quiet team's own count of a short chat is timed too (its latency against its idle latency).
Prints each phase, its ratio of p99 to the idle p99, and how the attacker's calls were answered (their statuses).
The bar: the quiet team's p99 within 2x of idle under each attack. No assertions.
`--quick` (or SLUICE_BENCH_QUICK=1) runs a small version. `measure()` is the same run for another bench to call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness beside the packages

import httpx

from bench.harness.stand_ins import below_the_gateway
from bench.harness.stats import percentile
from testkit.admin import team_key
from testkit.sluice import MODEL, running_sluice

WORDS = "the quick brown fox jumps over the lazy dog near a river bank. "
CONTEXT = 4096
QUIET_COUNT = "quiet count_tokens"  # the quiet team's own token count, idle and under the count_tokens attack
# the most a chat can be and still be tokenized: 9/10 of the context x SmolLM2's 82 bytes a token at most
# (worker/token_bytes.py): about 16k tokens of these words, so refused as too long only once tokenized
CHAT_BYTES = CONTEXT * 82 * 9 // 10
# both teams have the default limits (rpm 1200, tpm 2M, 64 concurrent sequences)
CONFIG = f'[[models]]\nname = "{MODEL}"\nmax_batch_size = 16\nmax_context = {CONTEXT}\n'


def attacks() -> dict[str, tuple[str, dict]]:
    ids = [100 + i % 40_000 for i in range(400_000)]
    return {
        "many ids (item 2)": ("/v1/completions", {"model": MODEL, "prompt": ids, "max_tokens": 4,
                                                   "token_index_to_replace": [0], "embedding_to_replace": [0.5] * 576}),
        "4 MB prompt (item 3)": ("/v1/completions", {"model": MODEL, "max_tokens": 4,
                                                      "prompt": WORDS * (4_000_000 // len(WORDS))}),
        "300 KB chats (item 3)": ("/v1/chat/completions", {"model": MODEL, "max_tokens": 4, "messages": [
            {"role": "user", "content": WORDS * (CHAT_BYTES // len(WORDS))}]}),
        "count_tokens (item 9)": ("/v1/messages/count_tokens", {"model": MODEL, "messages": [
            {"role": "user", "content": WORDS * (250_000 // len(WORDS))}]}),
    }


class Attack:
    """`clients` threads that send one body again and again, as one team, until stopped."""

    def __init__(self, url: str, key: str, path: str, body: dict, clients: int):
        self.url, self.key, self.path = url, key, path
        self.body = json.dumps(body).encode()  # once: the attack's own CPU must not be the victim's cost
        self.statuses: Counter[int] = Counter()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, index: int) -> None:
        below_the_gateway([threading.get_native_id()])  # the attacker stands in for other machines
        headers = {"authorization": f"Bearer {self.key}", "x-forwarded-for": f"10.66.0.{index}",
                   "content-type": "application/json"}
        with httpx.Client(timeout=600) as client:
            while not self.stop.is_set():
                try:
                    status = client.post(f"{self.url}{self.path}", content=self.body, headers=headers).status_code
                except httpx.HTTPError:
                    status = 0  # the connection failed
                self.statuses[status] += 1

    def __enter__(self) -> Attack:
        for thread in self.threads:
            thread.start()
        time.sleep(2.0)  # the first bodies reach the worker
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=600)


def ttft(client: httpx.Client, url: str, key: str) -> float:
    """Seconds from sending a streamed 4-token chat to its first chunk."""
    body = {"model": MODEL, "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "Say hello."}]}
    started = time.perf_counter()
    with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                       headers={"authorization": f"Bearer {key}"}) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                return time.perf_counter() - started
    raise RuntimeError(f"no chunk: {response.status_code}")


def count(client: httpx.Client, url: str, key: str) -> float:
    """Seconds for a token count of a short chat (Anthropic's route)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}]}
    started = time.perf_counter()
    client.post(f"{url}/v1/messages/count_tokens", json=body, headers={"x-api-key": key}).raise_for_status()
    return time.perf_counter() - started


def phase(url: str, key: str, probes: int, probe=ttft) -> list[float]:
    with httpx.Client(timeout=600) as client:
        times = []
        for _ in range(probes):
            times.append(probe(client, url, key))
            time.sleep(0.05)
    return times


def measure(probes: int, attackers: int, quick: bool = False, only: str = "") -> dict[str, list[float]]:
    """The quiet team's TTFTs (seconds) idle and under each attack, by phase name; prints as it goes. `only`: the
    attacks whose names hold one of these comma-separated words."""
    chosen = attacks()
    if quick:  # the two that reach the worker's tokenizer
        chosen = {name: chosen[name] for name in ("300 KB chats (item 3)", "count_tokens (item 9)")}
    if only:
        chosen = {name: attack for name, attack in chosen.items() if any(w in name for w in only.split(","))}
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as data, running_sluice(Path(data), config=CONFIG) as server:
        quiet, hostile = team_key(server, "quiet"), team_key(server, "hostile")
        print(f"{MODEL}, one worker; {attackers} attacking clients; {probes} quiet streamed chats per phase; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
        phase(server.url, quiet, 2)  # warm-up
        results["idle"] = phase(server.url, quiet, probes)
        results[QUIET_COUNT + ", idle"] = phase(server.url, quiet, probes, count)
        for name, (path, body) in chosen.items():
            with Attack(server.url, hostile, path, body, attackers) as attack:
                results[name] = phase(server.url, quiet, probes)
                if "count_tokens" in name:  # what item 9 measured: another team's count, not its chat
                    results[QUIET_COUNT] = phase(server.url, quiet, probes, count)
            print(f"  {name}: p99 {percentile(results[name], 0.99) * 1000:.0f} ms; attacker answers "
                  f"{dict(sorted(attack.statuses.items()))}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", default=os.environ.get("SLUICE_BENCH_QUICK") == "1")
    parser.add_argument("--probes", type=int, default=None, help="quiet chats per phase")
    parser.add_argument("--attackers", type=int, default=6, help="the attacking team's concurrent clients")
    parser.add_argument("--only", default="", help="attacks whose names hold one of these words (comma-separated)")
    args = parser.parse_args()
    results = measure(args.probes or (6 if args.quick else 30), args.attackers, args.quick, args.only)
    print(f"\n{'quiet team TTFT':<32} {'p50 ms':>9} {'p99 ms':>9} {'p99 / idle':>11}")
    for name, times in results.items():
        idle = percentile(results[QUIET_COUNT + ", idle" if name.startswith(QUIET_COUNT) else "idle"], 0.99)
        print(f"{name:<32} {statistics.median(times) * 1000:>9.1f} {percentile(times, 0.99) * 1000:>9.1f} "
              f"{percentile(times, 0.99) / idle:>10.2f}x")
    print("\nbar: every attack's p99 within 2x of idle.")


if __name__ == "__main__":
    main()
