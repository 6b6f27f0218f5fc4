"""A large batch file through `POST /v1/files` and `POST /v1/batches` (#48): the gateway's peak RSS growth while it
streams in and back out, and while a batch is made of it, against the file's own size (the whole-body paths held the
file at least twice: growth / size >= 2; the old batch create also held every line parsed).

    .venv/bin/python bench/upload_memory.py [--mib 200] [--quick]

One `sluice serve` (SQLite, bodies in its data dir; the protocol worker stands behind it for `/health`, nothing
runs on it), `max_file_bytes` raised to the file. Prints the upload's and the download's MiB/s, the upload's MiB
per gateway CPU-second, the gateway's RSS before, its peak (VmHWM, reset before the upload) and the growth / file
size ratio; then the same for the batch create (lines per second written; the batch is cancelled). No assertions.
`--quick` (or SLUICE_BENCH_QUICK=1): 20 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.admin import admin  # noqa: E402
from testkit.protocol_worker import worker_process  # noqa: E402
from testkit.sluice import MODEL, running_sluice  # noqa: E402
from testkit.stub_gateway import ADMIN_KEY  # noqa: E402

MIB = 1 << 20
LINE = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi " * 40}]}}).encode() + b"\n"
NUMBERED = LINE.replace(b'"x"', b'"c%07d"')  # a batch's lines need their own custom_ids


def kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds (a shared machine's wall time says little)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--quick", action="store_true", default=os.environ.get("SLUICE_BENCH_QUICK") == "1")
    args = parser.parse_args()
    size = (20 if args.quick else args.mib) * MIB
    body = b"".join(NUMBERED % n for n in range(min(size // len(NUMBERED), 1_000_000)))
    config = (f"[batches]\nmax_file_bytes = {len(body) + MIB}\nmax_file_lines = 1000000\n"
              f"team_max_file_bytes = {4 * len(body)}\nteam_max_enqueued_tokens = {len(body) * 10}\n"
              f'[[models]]\nname = "{MODEL}"\n'
              'provisioner = {{ kind = "static", urls = ["{url}"] }}\n')
    with (tempfile.TemporaryDirectory() as data, worker_process(token_delay=0, quiet=True) as worker,
          running_sluice(Path(data), config=config.format(url=worker.url),
                         env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as server):
        team = admin(server, "POST", "/admin/teams", name="bench")["id"]
        key = admin(server, "POST", "/admin/keys", name="bench", team_id=team)["key"]
        with httpx.Client(base_url=server.url, timeout=600) as client:
            auth = {"authorization": f"Bearer {key}"}
            client.post("/v1/files", headers=auth, data={"purpose": "batch"}, files={"file": ("w.jsonl", LINE)})
            pid = server.process.pid
            before = kib(pid, "VmRSS")
            Path(f"/proc/{pid}/clear_refs").write_text("5")
            started, cpu = time.perf_counter(), cpu_s(pid)
            made = client.post("/v1/files", headers=auth, data={"purpose": "batch"},
                               files={"file": ("big.jsonl", body)})
            up_s, up_cpu = time.perf_counter() - started, cpu_s(pid) - cpu
            assert made.status_code == 200, made.text
            started, received = time.perf_counter(), 0
            with client.stream("GET", f"/v1/files/{made.json()['id']}/content", headers=auth) as answer:
                for piece in answer.iter_bytes():
                    received += len(piece)
            down_s = time.perf_counter() - started
            peak = kib(pid, "VmHWM")
            batch_before = kib(pid, "VmRSS")
            Path(f"/proc/{pid}/clear_refs").write_text("5")
            started = time.perf_counter()
            batch = client.post("/v1/batches", headers=auth, json={
                "input_file_id": made.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})
            batch_s = time.perf_counter() - started
            batch_peak = kib(pid, "VmHWM")
            assert batch.status_code == 200 and batch.json()["status"] == "in_progress", batch.text
            client.post(f"/v1/batches/{batch.json()['id']}/cancel", headers=auth)
    lines = len(body) // len(NUMBERED)
    growth = (peak - before) / 1024
    print(f"file {len(body) / MIB:.0f} MiB: upload {len(body) / MIB / up_s:.0f} MiB/s ({len(body) / MIB / up_cpu:.0f} "
          f"MiB per gateway CPU-second), download {received / MIB / down_s:.0f} MiB/s")
    print(f"gateway RSS before {before / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB: growth {growth:.1f} MiB = "
          f"{growth * MIB / len(body):.3f} x the file (whole-body path: >= 2)")
    batch_growth = (batch_peak - batch_before) / 1024
    print(f"batch of {lines} lines made in {batch_s:.1f} s ({lines / batch_s:.0f} lines/s): RSS before "
          f"{batch_before / 1024:.0f} MiB, peak {batch_peak / 1024:.0f} MiB: growth {batch_growth:.1f} MiB = "
          f"{batch_growth * MIB / len(body):.3f} x the file")


if __name__ == "__main__":
    main()
