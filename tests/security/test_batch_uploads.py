"""Streamed file uploads through the real `sluice serve` (SQLite, bodies in its data dir), with the edge's default
body shares (16 MiB per client): a file larger than the share uploads and downloads with the gateway's peak memory
growing by a few MiB, not by the file; every upload bound answers in OpenAI's envelope through the `openai` SDK;
a team's uploads in progress are bounded and a cut upload gives its place back; a gateway SIGKILLed mid-upload
comes back with no file of it (gateway/batches/upload.py, files.py, gateway/edge/http_limits.py)."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import openai
import pytest

from testkit.admin import admin
from testkit.protocol_worker import MODEL, worker_process
from testkit.sluice import SluiceServer, running_sluice, start_sluice
from testkit.stub_gateway import ADMIN_KEY

MIB = 1 << 20
BOUNDARY = "sluice-upload-boundary"
LINE = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi " * 40}]}}).encode() + b"\n"


def config(worker_url: str, batches: str = "") -> str:
    return (f'default_team_limits = {{}}\nrejections_per_minute = 1000000\n'
            f'[batches]\nmax_file_bytes = {40 * MIB}\nmax_file_lines = 200000\nmax_line_bytes = 4096\n'
            f'team_max_concurrent_uploads = 2\n{batches}\n'
            f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{worker_url}"] }}\n')


@pytest.fixture(scope="module")
def worker():
    with worker_process(token_delay=0, quiet=True) as running:
        yield running


@pytest.fixture(scope="module")
def server(worker, tmp_path_factory) -> Iterator[SluiceServer]:
    with running_sluice(tmp_path_factory.mktemp("uploads"), config=config(worker.url),
                        env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as running:
        yield running


def team_key(server: SluiceServer, name: str) -> str:
    team = admin(server, "POST", "/admin/teams", name=name)["id"]
    return admin(server, "POST", "/admin/keys", name=f"{name}-key", team_id=team)["key"]


def client(server: SluiceServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120)


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def test_a_file_past_the_edge_share_streams_in_and_out_with_bounded_memory(server):
    key = team_key(server, "big-uploads")
    api = client(server, key)
    body = LINE * ((20 * MIB) // len(LINE))  # more than the edge's 16 MiB per client of bodies in progress
    api.files.create(file=("warm.jsonl", io.BytesIO(LINE)), purpose="batch")  # first-use costs out of the measure
    pid = server.process.pid
    before = _status_kib(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) from now on
    made = api.files.create(file=("big.jsonl", io.BytesIO(body)), purpose="batch")
    assert made.bytes == len(body)
    assert api.files.content(made.id).content == body
    growth_mib = (_status_kib(pid, "VmHWM") - before) / 1024
    print(f"20 MiB upload + download: gateway peak RSS grew {growth_mib:.1f} MiB")
    assert growth_mib < 12, growth_mib  # the old whole-body path held the file at least twice (40+ MiB)
    other = client(server, team_key(server, "big-uploads-other"))
    with pytest.raises(openai.NotFoundError):
        other.files.content(made.id)


@pytest.mark.parametrize(("body", "status", "code"), [
    (b'{"x": "' + b"y" * 5000 + b'"}\n', 400, "line_too_large"),
    (b"{}\n" * 200_001, 400, "too_many_lines"),
    (LINE * ((41 * MIB) // len(LINE)), 413, None),
])
def test_each_upload_bound_is_the_apis_error(server, body, status, code):
    api = client(server, team_key(server, f"bounds-{status}-{code}"))
    with pytest.raises(openai.APIStatusError) as refused:
        api.files.create(file=("in.jsonl", io.BytesIO(body)), purpose="batch")
    assert refused.value.status_code == status
    if code:
        assert refused.value.body["code"] == code
    assert api.files.list().data == []


def multipart(data: bytes, purpose: bytes = b"batch") -> bytes:
    return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n".encode() + purpose
            + f"\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n"
              "Content-Type: application/jsonl\r\n\r\n".encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode())


@contextlib.contextmanager
def half_upload(server: SluiceServer, key: str, size: int = 3 * MIB) -> Iterator[socket.socket]:
    """An upload whose body stops halfway, its connection held open."""
    body = multipart(LINE * (size // len(LINE)))
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"POST /v1/files HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
                 f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {len(body)}\r\n\r\n"
                 .encode() + body[:len(body) // 2])
    try:
        yield sock
    finally:
        sock.close()


def parts(server: SluiceServer) -> list[Path]:
    return sorted((server.data_dir / "batch_files").glob(".file-*.part"))


def wait_for(condition, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return value


def test_a_teams_uploads_in_progress_are_bounded_and_a_cut_one_gives_its_place_back(server):
    key = team_key(server, "concurrent")
    api = client(server, key)
    started = len(parts(server))
    with half_upload(server, key), half_upload(server, key):
        wait_for(lambda: len(parts(server)) == started + 2, "both uploads streaming to disk")
        with pytest.raises(openai.RateLimitError) as refused:
            api.files.create(file=("third.jsonl", io.BytesIO(LINE)), purpose="batch")
        assert refused.value.body["code"] == "too_many_uploads"
        other = client(server, team_key(server, "concurrent-other"))  # another team's uploads are its own
        assert other.files.create(file=("x.jsonl", io.BytesIO(LINE)), purpose="batch").bytes == len(LINE)
    wait_for(lambda: len(parts(server)) == started, "the cut uploads' bodies dropped")
    assert api.files.list().data == []  # nothing of the cut uploads
    assert api.files.create(file=("after.jsonl", io.BytesIO(LINE)), purpose="batch").bytes == len(LINE)


@pytest.mark.parametrize(("body", "message"), [
    (multipart(LINE, purpose=b"fine-tune"), "purpose"),
    (multipart(LINE)[:-30], "multipart"),  # the closing boundary never comes
    (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{BOUNDARY}--\r\n".encode(),
     "file"),
])
def test_a_malformed_form_is_a_400(server, body, message):
    key = team_key(server, f"malformed-{message}")
    answer = httpx.post(f"{server.url}/v1/files", content=body, timeout=30,
                        headers={"authorization": f"Bearer {key}",
                                 "content-type": f"multipart/form-data; boundary={BOUNDARY}"})
    assert answer.status_code == 400, answer.text
    assert message in answer.text
    assert client(server, key).files.list().data == []


def test_a_gateway_killed_mid_upload_keeps_no_half_file(worker, tmp_path):
    env = {"SLUICE_ADMIN_KEY": ADMIN_KEY}
    gateway = start_sluice(tmp_path, config=config(worker.url), env=env)
    try:
        key = team_key(gateway, "killed")
        with half_upload(gateway, key, size=8 * MIB):
            wait_for(lambda: parts(gateway) and parts(gateway)[0].stat().st_size >= MIB, "the body on disk")
            gateway.stop(signal.SIGKILL)
    finally:
        gateway.stop()
    with running_sluice(tmp_path, config=config(worker.url), env=env) as again:
        api = client(again, key)
        assert api.files.list().data == []
        assert api.files.create(file=("next.jsonl", io.BytesIO(LINE)), purpose="batch").bytes == len(LINE)


def test_an_upload_may_outlast_the_body_timeout_but_never_stall_that_long(worker, tmp_path):
    """`body_timeout_s` 2: a body that keeps coming for longer passes, one that stops for 2 s is cut (408) and the
    upload's place is given back."""
    settings = "[http]\nbody_timeout_s = 2\n"
    with running_sluice(tmp_path, config=config(worker.url, settings), env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as server:
        key = team_key(server, "trickle")
        body = multipart(LINE * 400)
        pieces = [body[start:start + len(body) // 8 + 1] for start in range(0, len(body), len(body) // 8 + 1)]

        def trickle():
            for piece in pieces:
                yield piece
                time.sleep(0.4)  # 8 pieces: ~3 s in all, never 2 s without bytes

        made = httpx.post(f"{server.url}/v1/files", content=trickle(), timeout=30,
                          headers={"authorization": f"Bearer {key}", "content-length": str(len(body)),
                                   "content-type": f"multipart/form-data; boundary={BOUNDARY}"})
        assert made.status_code == 200, made.text
        with half_upload(server, key) as stalled:
            stalled.settimeout(30)
            answer = stalled.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408") and b"body_timeout" in answer
        wait_for(lambda: parts(server) == [], "the stalled upload's body dropped")
        api = client(server, key)
        assert api.files.create(file=("after.jsonl", io.BytesIO(LINE)), purpose="batch").bytes == len(LINE)
        assert len(api.files.list().data) == 2


def test_file_bodies_in_s3_stream_both_ways_and_stay_their_teams(worker, tmp_path):
    """`file_bucket` set (moto's S3 server): the upload is an S3 object (multipart past 8 MiB) and nothing on the
    data dir; its content streams back, to its team only."""
    from testkit.local_aws import moto_server

    with moto_server() as endpoint:
        aws = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
        s3.create_bucket(Bucket="sluice-batch-files")
        settings = f'file_bucket = "sluice-batch-files"\nfile_prefix = "files/"\ns3_endpoint_url = "{endpoint}"\n'
        with running_sluice(tmp_path, config=config(worker.url, settings),
                            env={"SLUICE_ADMIN_KEY": ADMIN_KEY, **aws}) as server:
            api = client(server, team_key(server, "s3-team"))
            body = LINE * ((10 * MIB) // len(LINE))
            made = api.files.create(file=("big.jsonl", io.BytesIO(body)), purpose="batch")
            stored = s3.head_object(Bucket="sluice-batch-files", Key=f"files/{made.id}.jsonl")
            assert stored["ContentLength"] == len(body)
            assert not (server.data_dir / "batch_files").exists() or parts(server) == []
            assert api.files.content(made.id).content == body
            with pytest.raises(openai.NotFoundError):
                client(server, team_key(server, "s3-other")).files.content(made.id)
            api.files.delete(made.id)
            assert s3.list_objects_v2(Bucket="sluice-batch-files").get("KeyCount", 0) == 0
