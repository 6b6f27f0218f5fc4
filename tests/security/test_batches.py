"""Batches (#48) through the real `sluice serve` (SQLite in its data dir) in front of the protocol worker, called
with the real `openai` and `anthropic` SDKs: the whole life of a batch, each team's files and batches kept from
every other team, and bad input answered in each API's own shapes (a failed batch's `errors`, a line's error in
the error file), never a 500."""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from testkit.admin import admin
from testkit.protocol_worker import MODEL, protocol_worker, worker_process
from testkit.sluice import SluiceServer, running_sluice
from testkit.stub_gateway import ADMIN_KEY

MAX_FILE_BYTES = 64 << 10
MAX_LINES = 40


@contextlib.contextmanager
def served(data_dir: Path, batches: str = "") -> Iterator[tuple[SluiceServer, str]]:
    with worker_process(token_delay=0, quiet=True) as worker:
        config = (f'default_team_limits = {{}}\nrejections_per_minute = 1000000\n'
                  f'[batches]\nmax_file_bytes = {MAX_FILE_BYTES}\nmax_file_lines = {MAX_LINES}\n'
                  f'poll_interval_s = 0.2\nin_flight_per_endpoint = 2\n{batches}\n'
                  f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{worker.url}"] }}\n')
        with running_sluice(data_dir, config=config, env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as server:
            yield server, worker.url


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with served(tmp_path_factory.mktemp("batches")) as pair:
        yield pair


@pytest.fixture(scope="module")
def server(gateway) -> SluiceServer:
    return gateway[0]


def team_key(server: SluiceServer, name: str) -> tuple[str, str]:
    team = admin(server, "POST", "/admin/teams", name=name)["id"]
    return team, admin(server, "POST", "/admin/keys", name=f"{name}-key", team_id=team)["key"]


@pytest.fixture(scope="module")
def teams(server):
    return team_key(server, "batch-a"), team_key(server, "batch-b")


def client(server: SluiceServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)


def chat_line(custom_id: str, content: str = "hello", model: str = MODEL, **extra) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 5, **extra}}


def jsonl(lines: list) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)


def upload(api: openai.OpenAI, lines: list) -> str:
    return api.files.create(file=("input.jsonl", io.BytesIO(jsonl(lines))), purpose="batch").id


def wait_ended(get, statuses=("completed", "failed", "expired", "cancelled", "ended"), timeout=120.0):
    deadline = time.monotonic() + timeout
    while True:
        batch = get()
        status = getattr(batch, "status", None) or getattr(batch, "processing_status", None)
        if status in statuses:
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)


def lines_of(api: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(row) for row in api.files.content(file_id).text.splitlines()]


def test_an_openai_batch_runs_every_line_once_and_reports_each_by_custom_id(server, teams):
    (_, key), _ = teams
    api = client(server, key)
    file_id = upload(api, [chat_line(f"req-{i}", f"question {i}") for i in range(6)]
                     + [chat_line("bad-body", max_tokens=-3)])
    assert api.files.retrieve(file_id).purpose == "batch"
    batch = api.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                               metadata={"job": "nightly"})
    assert batch.status == "in_progress" and batch.metadata == {"job": "nightly"}
    done = wait_ended(lambda: api.batches.retrieve(batch.id))
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (7, 6, 1)
    assert done.completed_at and done.finalizing_at and done.in_progress_at
    assert done.usage.output_tokens > 0
    output = lines_of(api, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == [f"req-{i}" for i in range(6)]
    for line in output:
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert line["response"]["body"]["object"] == "chat.completion"
        assert line["response"]["body"]["id"].endswith(line["response"]["request_id"])
    errors = lines_of(api, done.error_file_id)
    assert [line["custom_id"] for line in errors] == ["bad-body"]
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["param"] == "max_tokens"
    assert batch.id in {b.id for b in api.batches.list(limit=5).data}
    records = usage_records(server, key)
    mine = [r for r in records if r["route"] == "/v1/chat/completions"]
    assert len({r["request_id"] for r in mine}) == len(mine) >= 7


def usage_records(server: SluiceServer, key: str) -> list[dict]:
    deadline = time.monotonic() + 120
    while True:
        answer = httpx.get(f"{server.url}/v1/usage/requests", headers={"authorization": f"Bearer {key}"},
                           params={"limit": 1000}, timeout=30)
        assert answer.status_code == 200, answer.text
        data = answer.json()["data"]
        if len(data) >= 7 or time.monotonic() > deadline:
            return data
        time.sleep(0.3)


def test_cancel_and_list_paging(server, teams):
    (_, key), _ = teams
    api = client(server, key)
    created = []
    for _ in range(3):
        file_id = upload(api, [chat_line("only")])
        created.append(api.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                          completion_window="24h").id)
    first = api.batches.list(limit=2)
    assert len(first.data) == 2 and first.has_more
    second = api.batches.list(limit=2, after=first.data[-1].id)
    assert first.data[-1].id not in {b.id for b in second.data}
    every = [b.id for b in api.batches.list(limit=2)]  # the SDK pages with `after`
    assert set(created) <= set(every) and len(every) == len(set(every))
    file_id = upload(api, [chat_line(f"c-{i}") for i in range(MAX_LINES)])
    batch = api.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    cancelled = api.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled", "completed")
    done = wait_ended(lambda: api.batches.retrieve(batch.id))
    if done.status == "cancelled":
        counts = done.request_counts
        assert counts.completed + counts.failed == counts.total == MAX_LINES
        outcome = lines_of(api, done.output_file_id) + lines_of(api, done.error_file_id)
        assert sorted(line["custom_id"] for line in outcome) == sorted(f"c-{i}" for i in range(MAX_LINES))
        assert all(line["error"]["code"] == "batch_cancelled" for line in lines_of(api, done.error_file_id))


def test_another_teams_files_and_batches_are_unknown(server, teams):
    (_, key_a), (_, key_b) = teams
    a, b = client(server, key_a), client(server, key_b)
    file_id = upload(a, [chat_line("mine")])
    batch = a.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (lambda: b.files.retrieve(file_id), lambda: b.files.content(file_id),
                 lambda: b.files.delete(file_id), lambda: b.batches.retrieve(batch.id),
                 lambda: b.batches.cancel(batch.id),
                 lambda: b.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                          completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert file_id not in {f.id for f in b.files.list()}
    assert batch.id not in {x.id for x in b.batches.list()}
    done = wait_ended(lambda: a.batches.retrieve(batch.id))
    with pytest.raises(openai.NotFoundError):
        b.files.content(done.output_file_id)
    other = anthropic.Anthropic(base_url=server.url, api_key=key_b, max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        other.messages.batches.retrieve(batch.id)
    assert a.files.retrieve(file_id).id == file_id


def test_a_line_for_another_teams_private_endpoint_is_that_lines_404(gateway, teams):
    server, worker_url = gateway
    (_, key_a), (team_b, _) = teams
    admin(server, "POST", "/admin/endpoints", name="b-private", team_id=team_b,
          provisioner={"kind": "static", "urls": [worker_url]})
    api = client(server, key_a)
    batch = api.batches.create(input_file_id=upload(api, [chat_line("x", model="b-private")]),
                               endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_ended(lambda: api.batches.retrieve(batch.id))
    assert done.status == "completed" and done.output_file_id is None
    [line] = lines_of(api, done.error_file_id)
    assert line["response"]["status_code"] == 404 and "b-private" in line["response"]["body"]["error"]["message"]


@pytest.mark.parametrize(("lines", "code"), [
    ([b"{not json", chat_line("ok")], "invalid_json_line"),
    ([chat_line("same"), chat_line("same")], "duplicate_custom_id"),
    ([chat_line("x") | {"url": "/v1/completions"}], "invalid_url"),
    ([chat_line("x"), chat_line("y", model="other")], "mismatched_model"),
    ([{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": []}], "invalid_body"),
    ([chat_line("x" * 65)], "invalid_custom_id"),
], ids=["json", "duplicate", "url", "models", "body", "custom_id"])
def test_an_invalid_input_file_fails_the_batch_with_each_line_named(server, teams, lines, code):
    (_, key), _ = teams
    api = client(server, key)
    batch = api.batches.create(input_file_id=upload(api, lines), endpoint="/v1/chat/completions",
                               completion_window="24h")
    assert batch.status == "failed" and batch.failed_at
    assert code in {error.code for error in batch.errors.data}, batch.errors


def test_batch_lines_reach_the_worker_at_batch_priority_and_interactive_requests_do_not(server, teams):
    (_, key), _ = teams
    api = client(server, key)
    with protocol_worker() as recorded:  # keeps the GenerateRequest bodies it received
        admin(server, "POST", "/admin/endpoints", name="recorded",
              provisioner={"kind": "static", "urls": [recorded.url]})
        batch = api.batches.create(input_file_id=upload(api, [chat_line(f"p-{i}", model="recorded") for i in range(2)]),
                                   endpoint="/v1/chat/completions", completion_window="24h")
        assert wait_ended(lambda: api.batches.retrieve(batch.id)).request_counts.completed == 2
        api.chat.completions.create(model="recorded", messages=[{"role": "user", "content": "now"}], max_tokens=5)
    assert [body["priority"] for body in recorded.requests] == ["batch", "batch", "interactive"]


def test_a_revoked_keys_batch_runs_no_more_lines(server, teams):
    (team, _), _ = teams
    made = admin(server, "POST", "/admin/keys", name="short-lived", team_id=team)
    api = client(server, made["key"])
    with worker_process(token_delay=0.05, quiet=True) as slow:  # lines that take a while: the revoke comes first
        admin(server, "POST", "/admin/endpoints", name="slow", provisioner={"kind": "static", "urls": [slow.url]})
        lines = [chat_line(f"r-{i}", model="slow") for i in range(12)]
        batch = api.batches.create(input_file_id=upload(api, lines), endpoint="/v1/chat/completions",
                                   completion_window="24h")
        admin(server, "DELETE", f"/admin/keys/{made['id']}")
        done = wait_ended(lambda: client(server, teams[0][1]).batches.retrieve(batch.id))
    owner = client(server, teams[0][1])  # the team's other key reads the batch
    errors = lines_of(owner, done.error_file_id)
    assert errors and all(line["response"]["body"]["error"]["code"] == "revoked_api_key" for line in errors)
    assert done.request_counts.completed + len(errors) == 12


def test_malformed_multipart_uploads_are_4xx(server, teams):
    (_, key), _ = teams
    headers = {"authorization": f"Bearer {key}"}
    for content_type, body in (("multipart/form-data", b"--x\r\n"),
                               ("multipart/form-data; boundary=x", b"--x\r\nContent-Disposition: form-data\r\n"),
                               ("multipart/form-data; boundary=x", b"garbage"),
                               ("multipart/form-data; boundary=x", b"--x--\r\n")):
        response = httpx.post(f"{server.url}/v1/files", headers={**headers, "content-type": content_type},
                              content=body, timeout=30)
        assert 400 <= response.status_code < 500, (content_type, body, response.text)
        assert response.json()["error"]["message"]


def test_bad_requests_get_openai_errors_never_a_500(server, teams):
    (_, key), _ = teams
    api = client(server, key)
    with pytest.raises(openai.APIStatusError) as too_big:
        api.files.create(file=("big.jsonl", io.BytesIO(b"x" * (MAX_FILE_BYTES + 1))), purpose="batch")
    assert too_big.value.status_code == 413
    with pytest.raises(openai.BadRequestError):
        api.files.create(file=("lines.jsonl", io.BytesIO(jsonl([chat_line(f"{i}") for i in range(MAX_LINES + 1)]))),
                         purpose="batch")
    with pytest.raises(openai.BadRequestError):
        api.files.create(file=("x.jsonl", io.BytesIO(b"{}")), purpose="fine-tune")
    file_id = upload(api, [chat_line("x")])
    with pytest.raises(openai.BadRequestError):
        api.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        api.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="1h")
    with pytest.raises(openai.BadRequestError):
        api.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                           metadata={f"k{i}": "v" for i in range(17)})
    api.files.delete(file_id)
    with pytest.raises(openai.NotFoundError):
        api.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    headers = {"authorization": f"Bearer {key}"}
    for response in (httpx.post(f"{server.url}/v1/files", headers=headers, content=b"{}", timeout=30),
                     httpx.post(f"{server.url}/v1/files", headers=headers, timeout=30,
                                files={"purpose": (None, "batch")}),
                     httpx.post(f"{server.url}/v1/batches", headers=headers, content=b"[1]", timeout=30),
                     httpx.get(f"{server.url}/v1/batches?limit=0", headers=headers, timeout=30),
                     httpx.get(f"{server.url}/v1/files/{'f' * 500}", headers=headers, timeout=30)):
        assert 400 <= response.status_code < 500, response.text
        assert "error" in response.json()


def test_an_anthropic_batch_reports_succeeded_errored_and_canceled(server, teams):
    (_, key), _ = teams
    api = anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0)
    requests = [{"custom_id": f"m-{i}", "params": {"model": MODEL, "max_tokens": 5,
                                                   "messages": [{"role": "user", "content": f"hi {i}"}]}}
                for i in range(4)]
    requests.append({"custom_id": "broken", "params": {"model": MODEL, "max_tokens": 5, "messages": []}})
    batch = api.messages.batches.create(requests=requests)
    assert batch.processing_status == "in_progress" and batch.request_counts.processing == 5
    done = wait_ended(lambda: api.messages.batches.retrieve(batch.id), statuses=("ended",))
    assert (done.request_counts.succeeded, done.request_counts.errored) == (4, 1)
    results = {r.custom_id: r.result for r in api.messages.batches.results(batch.id)}
    assert all(results[f"m-{i}"].type == "succeeded" and results[f"m-{i}"].message.content for i in range(4))
    assert results["broken"].type == "errored" and results["broken"].error.error.type == "invalid_request_error"
    assert batch.id in {b.id for b in api.messages.batches.list(limit=10)}
    assert api.messages.batches.delete(batch.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        api.messages.batches.retrieve(batch.id)
    with pytest.raises(anthropic.BadRequestError):
        api.messages.batches.create(requests=[requests[0], requests[0]])
    running = api.messages.batches.create(requests=[{"custom_id": f"c-{i}", "params": requests[0]["params"]}
                                                    for i in range(MAX_LINES)])
    with pytest.raises(anthropic.BadRequestError):
        api.messages.batches.delete(running.id)
    api.messages.batches.cancel(running.id)
    ended = wait_ended(lambda: api.messages.batches.retrieve(running.id), statuses=("ended",))
    counts = ended.request_counts
    assert counts.succeeded + counts.canceled == MAX_LINES and counts.processing == 0
    kinds = {r.result.type for r in api.messages.batches.results(running.id)}
    assert kinds <= {"succeeded", "canceled"}
