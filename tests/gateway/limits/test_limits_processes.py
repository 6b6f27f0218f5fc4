"""Proof that the limits hold across gateway processes: two OS processes, each with its own Redis limiter
against the same real redis-server, admitting concurrently."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import redis as syncredis

DRIVER = Path(__file__).with_name("proc_driver.py")
PROCESSES = 2


def run_processes(url: str, scenario: str) -> tuple[str, list[dict]]:
    prefix = f"proof:{uuid.uuid4().hex}"
    procs = [subprocess.Popen([sys.executable, str(DRIVER), url, prefix, scenario, str(PROCESSES)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(PROCESSES)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return prefix, results


def test_200_concurrent_against_rpm_50_admit_exactly_50(redis):
    _, results = run_processes(redis.url, "rpm")
    assert sum(r["admitted"] for r in results) == 50
    refused = [x for r in results for x in r["refused"]]
    assert len(refused) == 150
    # all refused by the window, told to come back when the first admission leaves it (< 60 s from now)
    assert all(kind == "rate_limit" and 55 < retry <= 60 for kind, retry in refused)


def test_concurrency_cap_of_3_is_never_exceeded(redis):
    _, results = run_processes(redis.url, "concurrency")
    assert max(r["max_inflight"] for r in results) in (2, 3)  # the cap is reached (contention), never passed
    assert sum(r["admitted"] for r in results) > 0 and sum(r["refused"] for r in results) > 0


def test_tpm_reservations_keep_the_total_within_the_limit(redis):
    prefix, results = run_processes(redis.url, "tpm")
    charged = sum(r["charged"] for r in results)
    assert 0 < charged <= 3000
    # the shared window agrees with what the processes were charged after their refunds
    window_sum = syncredis.Redis.from_url(redis.url).hget(f"{prefix}:key:proof:tok", "#sum")
    assert int(window_sum) == charged
