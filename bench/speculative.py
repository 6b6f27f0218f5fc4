"""Speculative decoding: tok/s of the same requests with and without draft tokens, same run.

    .venv/bin/python bench/speculative.py [--quick] [--streams 1,16] [--tokens 400] [--threads 1]
                                          [--quantization auto] [--dtype auto]

Two Engines in-process (as bench/prefix_cache.py drives them) on the same SmolLM2-135M weights in the worker's
default configuration: one with speculation (prompt lookup on, the code edit sending its `prediction`), the peer
with `prompt_lookup = false` and no prediction. Tasks, greedy: a code edit (a ~400-token
Python file with one function renamed, the file sent as `prediction`), a document rewrite with a few words
changed, a RAG answer quoting its context, a JSON transform, and free chat; each at 1 and 16 concurrent streams.
For each: tok/s both sides (completion tokens of all streams / wall time from the first submit to the last
Done), the ratio, the prediction tokens accepted / rejected, and whether the greedy outputs are identical.
Targets (issue #47): code edit with prediction >= 3x at 1 stream; RAG / rewrite >= 1.5x at 1 stream; free chat
and every task at 16 streams >= 0.97x; identical output everywhere. llama-server is not run: no binary is built
on the development box. The box is shared with other engineers' runs: compare the ratios, not the times.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import torch

# run as a script, this file's folder comes first on sys.path and its name would shadow the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from common.protocol import Done, Error, Finish, GenerateRequest, ModelConfig, SamplingParams  # noqa: E402
from worker.engine.engine import Engine  # noqa: E402
from worker.loading import load_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

CODE = '''import csv
from dataclasses import dataclass


@dataclass
class Item:
    name: str
    price: float
    quantity: int


def read_items(path):
    """Read the items of a CSV file with name, price and quantity columns."""
    items = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            items.append(Item(row["name"], float(row["price"]), int(row["quantity"])))
    return items


def compute_total(items):
    """The price of every item times its quantity, summed."""
    total = 0.0
    for item in items:
        total += item.price * item.quantity
    return total


def most_expensive(items):
    """The item with the highest price, or None for no items."""
    best = None
    for item in items:
        if best is None or item.price > best.price:
            best = item
    return best


def report(path):
    """A one-line summary of the items in a file."""
    items = read_items(path)
    total = compute_total(items)
    best = most_expensive(items)
    name = best.name if best else "nothing"
    return f"{len(items)} items, total {total:.2f}, most expensive: {name}"


def main():
    import sys
    for path in sys.argv[1:]:
        print(report(path))


if __name__ == "__main__":
    main()
'''

DOCUMENT = ("The library opens at nine on Monday and closes at six. Members may borrow up to five books for three "
            "weeks. Late returns cost ten cents a day. The reading room on the second floor is quiet and has forty "
            "desks. Children's stories are read aloud on Monday afternoons at four. The library is closed on public "
            "holidays and during the first week of August for cleaning.")
CONTEXT = ("[1] The Danube is Europe's second-longest river, flowing 2,850 kilometres from the Black Forest to the "
           "Black Sea. [2] It passes through ten countries, more than any other river in the world, including "
           "Austria, Hungary and Romania. [3] Vienna, Budapest and Belgrade are capital cities on its banks.")
RECORD = ('{"first_name": "Ada", "last_name": "Lovelace", "born": 1815, "city": "London", '
          '"interests": ["mathematics", "poetry", "engines"]}')

# (chat messages, or a plain prompt; the prediction): SmolLM2-135M follows an instruction loosely, so each task is
# worded the way this model does it (the code edit opens the assistant's code block; the rewrite and the JSON
# transform are plain completions)
TASKS = {
    "code edit (prediction)": ([{"role": "user", "content": "Rename compute_total to sum_prices in this file.\n\n"
                                "```python\n" + CODE + "```"}, {"role": "assistant", "content": "```python\n"}], CODE),
    "document rewrite": ("Notice:\n" + DOCUMENT + "\n\nThe same notice, with Tuesday instead of Monday:\n", None),
    "RAG answer": ([{"role": "system", "content": "Answer from the context, quoting it word for word."},
                    {"role": "user", "content": f"Context: {CONTEXT}\n\nQuestion: what does the context say about "
                     "the Danube? Quote every sentence."}], None),
    "JSON transform": (RECORD + "\n\nThe same JSON object with first_name renamed to given_name:\n", None),
    "free chat": ([{"role": "user", "content": "Tell me a short story about a lighthouse keeper and a cat."}], None),
}


def generate_request(request_id: str, task, prediction: str | None, tokens: int) -> GenerateRequest:
    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    if isinstance(task, str):
        return GenerateRequest(request_id=request_id, model="bench", prompt=task, prediction=prediction, params=params)
    prefilled = task[-1]["role"] == "assistant"
    return GenerateRequest(request_id=request_id, model="bench", messages=task, prediction=prediction, params=params,
                           continue_final_message=prefilled, add_generation_prompt=not prefilled)


def run(engine: Engine, task, prediction: str | None, streams: int, tokens: int, label: str):
    """(tok/s over all streams, outputs, accepted, rejected)."""
    ended = threading.Event()
    results: dict[int, list] = {}
    left = [streams]
    lock = threading.Lock()

    def sink_for(index: int):
        def sink(events) -> None:
            for event in events:
                if isinstance(event, Finish):
                    results.setdefault(index, [None, None])[0] = event.token_ids
                elif isinstance(event, Done):
                    results.setdefault(index, [None, None])[1] = event
                elif isinstance(event, Error):
                    raise SystemExit(f"{label}: {event.message}")
                if isinstance(event, (Done, Error)):
                    with lock:
                        left[0] -= 1
                        if not left[0]:
                            ended.set()
        return sink

    started = time.perf_counter()
    for index in range(streams):
        engine.submit(engine.prepare(generate_request(f"{label}-{index}", task, prediction, tokens)), sink_for(index))
    ended.wait(3600)
    seconds = time.perf_counter() - started
    dones = [results[i][1] for i in range(streams)]
    generated = sum(d.completion_tokens for d in dones)
    return (generated / seconds, [results[i][0] for i in range(streams)],
            sum(d.accepted_prediction_tokens for d in dones), sum(d.rejected_prediction_tokens for d in dones))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="1 stream, 160 tokens")
    parser.add_argument("--streams", default="1,16")
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tasks", default="", help="comma-separated prefixes of task names")
    args = parser.parse_args()
    streams = [1] if args.quick else [int(s) for s in args.streams.split(",")]
    tokens = 160 if args.quick else args.tokens
    os.environ.setdefault("SLUICE_MODEL_CACHE", str(REPO / ".data" / "test-model-cache"))
    torch.set_num_threads(args.threads)
    config = {"dtype": args.dtype, "quantization": args.quantization, "max_batch_size": 16, "max_context": 2048}
    loaded = load_model(ModelConfig(**config), REPO / ".bench" / "speculative")
    print(f"SmolLM2-135M {loaded.quantization} on {loaded.device}; greedy, up to {tokens} tokens a stream; load "
          f"average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared machine: compare ratios)")
    on, off = Engine(loaded, ModelConfig(**config)), Engine(loaded, ModelConfig(**config, prompt_lookup=False))
    for engine in (on, off):
        engine.start()
        engine.warm_up()
    wanted = [t for t in TASKS if not args.tasks or any(t.startswith(p) for p in args.tasks.split(","))]
    print(f"{'task':24} {'streams':>7} {'spec tok/s':>10} {'plain tok/s':>11} {'ratio':>6} "
          f"{'accepted':>8} {'rejected':>8} {'identical':>9}")
    try:
        for count in streams:
            for name in wanted:
                task, prediction = TASKS[name]
                plain = run(off, task, None, count, tokens, "plain")
                spec = run(on, task, prediction, count, tokens, "spec")
                print(f"{name:24} {count:7d} {spec[0]:10.1f} {plain[0]:11.1f} {spec[0] / plain[0]:6.2f} "
                      f"{spec[2]:8d} {spec[3]:8d} {str(spec[1] == plain[1]):>9}", flush=True)
    finally:
        on.stop()
        off.stop()
    print("targets: code edit >= 3x at 1 stream; RAG / rewrite >= 1.5x at 1 stream; free chat and 16 streams "
          ">= 0.97x; identical greedy output")


if __name__ == "__main__":
    main()
