"""Runs inside .bench/llamacpp (llama-cpp-python): the bench's requests one at a time on the GGUF file.

    python llamacpp_run.py < job.json > result.json

job: {"gguf": path, "threads": n, "tokens": n, "requests": [{"ids": [...], "settings": {...}}]}
result: {"requests": [{"ttft": s, "gaps": [s, ...], "tokens": n, "wall": s}], "peak_rss_mb": mb}
"""

import json
import sys
import time
from itertools import pairwise

from llama_cpp import Llama


def settings_for(settings: dict) -> dict:
    greedy = settings.get("temperature", 1.0) == 0
    return {"temp": 0.0 if greedy else settings.get("temperature", 1.0), "top_p": settings.get("top_p", 1.0),
            "top_k": 0, "min_p": 0.0, "repeat_penalty": settings.get("repetition_penalty", 1.0),
            "presence_penalty": settings.get("presence_penalty", 0.0),
            "frequency_penalty": settings.get("frequency_penalty", 0.0)}


def run_one(llm: Llama, ids: list[int], tokens: int, settings: dict) -> dict:
    start = time.perf_counter()
    stamps = []
    for _ in llm.generate(ids, reset=True, **settings_for(settings)):  # a raw generator: EOS does not stop it
        stamps.append(time.perf_counter())
        if len(stamps) >= tokens:
            break
    return {"ttft": stamps[0] - start, "gaps": [b - a for a, b in pairwise(stamps)],
            "tokens": len(stamps), "wall": stamps[-1] - start}


def peak_rss_mb() -> float:
    """VmHWM: getrusage's maxrss would include the parent's peak from before exec."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    job = json.load(sys.stdin)
    llm = Llama(model_path=job["gguf"], n_ctx=1024, n_batch=512, n_threads=job["threads"],
                n_threads_batch=job["threads"], seed=0, verbose=False)
    first = job["requests"][0]
    run_one(llm, first["ids"][:16], 4, first["settings"])  # warm-up
    results = [run_one(llm, r["ids"], job["tokens"], r["settings"]) for r in job["requests"]]
    peak = peak_rss_mb()
    json.dump({"requests": results, "peak_rss_mb": peak}, sys.stdout)


if __name__ == "__main__":
    main()
