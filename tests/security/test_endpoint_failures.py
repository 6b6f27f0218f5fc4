"""Tenant ↔ operator: why an endpoint failed, through the real `sluice serve` (stub worker for its configured model,
a real local worker process for the endpoint that fails).

The issue (#43, low): the reason an endpoint failed was the worker's last line (a source path, an exception) and
every tenant read it, in each 503's `endpoint_reason` and message and in `GET /v1/endpoints`. Now a tenant reads a
fixed phrase; the operator's views (the admin API, `/health` with an admin key, the log) keep the detail."""

from __future__ import annotations

import time

import httpx
import pytest

from common.protocol import Token
from testkit.admin import admin, admin_headers
from testkit.protocol_worker import MODEL, Reply, sluice_on_protocol_worker, tokens
from testkit.stub_gateway import ADMIN_KEY
from tests.security.stub_served import stub_served

SECRET_DIR = "/srv/acme-weights-5f2c"  # where the operator keeps weights: no tenant learns it
BROKEN = "acme/broken"
FIXED_REASONS = {"weights failed to load", "crash loop"}


def tenant(server, method: str, path: str, **body) -> httpx.Response:
    return httpx.request(method, f"{server.url}{path}", json=body or None, timeout=180,
                         headers={"authorization": f"Bearer {server.api_key}"})


def chat(server) -> httpx.Response:
    return tenant(server, "POST", "/v1/chat/completions", model=BROKEN, max_tokens=4,
                  messages=[{"role": "user", "content": "Hi"}])


def test_a_failed_endpoint_tells_tenants_a_fixed_reason_and_the_operator_the_detail(tmp_path):
    with stub_served(tmp_path / "gw", ADMIN_KEY) as server:
        admin(server, "POST", "/admin/endpoints", name=BROKEN, source=f"{SECRET_DIR}/model", min_replicas=0,
              max_replicas=1)
        deadline = time.monotonic() + 180
        while (answer := chat(server)).json()["error"].get("endpoint_state") != "failed":  # wakes it; cannot load
            assert answer.status_code == 503 and time.monotonic() < deadline, answer.text[:500]
            time.sleep(0.5)
        answers = {"openai": answer, "openai again": chat(server),
                   "anthropic": tenant(server, "POST", "/v1/messages", model=BROKEN, max_tokens=4,
                                       messages=[{"role": "user", "content": "Hi"}]),
                   "responses": tenant(server, "POST", "/v1/responses", model=BROKEN, input="Hi", store=False),
                   "endpoints": tenant(server, "GET", "/v1/endpoints"), "health": tenant(server, "GET", "/health")}
        for where, seen in answers.items():
            assert SECRET_DIR not in seen.text and "Error" not in seen.text.replace("_error", ""), (where, seen.text)
        assert all(answers[where].status_code == 503 for where in ("openai again", "anthropic", "responses"))
        error = answer.json()["error"]
        assert answer.status_code == 503 and error["code"] == "endpoint_failed"
        assert error["endpoint_reason"] in FIXED_REASONS, error
        listed = next(e for e in answers["endpoints"].json()["data"] if e["id"] == BROKEN)
        assert listed["state"] == "failed" and listed["reason"] in FIXED_REASONS

        # the operator keeps the whole story
        status = admin(server, "GET", f"/admin/endpoints/{BROKEN}")
        assert status["reason"] in FIXED_REASONS and SECRET_DIR in status["detail"]
        health = httpx.get(f"{server.url}/health", headers=admin_headers(server), timeout=30)
        assert SECRET_DIR in health.json()["reason"]


WORKER_FAULTS = {
    "connection refused before an answer": [Reply.dropped()],
    "connection lost mid-answer": [Reply.dropped(tokens()[:2])],
    # msgspec builds a struct unchecked: this one is encoded with a string where the contract has an int
    "an event off the contract": [Reply([tokens()[0], Token(index="not a number", token_id=1, text="a")])],
    "the worker secret refused": [Reply.refused(401, "unauthorized", f"secret mismatch in {SECRET_DIR}/worker.env")],
}


@pytest.mark.parametrize("fault", WORKER_FAULTS)
def test_a_worker_fault_tells_tenants_neither_addresses_nor_exception_text(tmp_path, fault):
    """One request each: the fault ejects the only replica for a while (a stream's error event carries the same
    error as this answer)."""
    with sluice_on_protocol_worker(tmp_path / "gw", ADMIN_KEY) as (server, worker):
        worker.replies = WORKER_FAULTS[fault]
        answer = httpx.post(f"{server.url}/v1/chat/completions", timeout=120,
                            headers={"authorization": f"Bearer {server.api_key}"},
                            json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
        assert answer.status_code >= 500 and answer.json()["error"]["message"], answer.text[:300]
        host = worker.url.removeprefix("http://")
        assert host not in answer.text and SECRET_DIR not in answer.text, (fault, answer.text[:500])
        assert "Error" not in answer.text.replace("_error", "") and "$." not in answer.text, (fault, answer.text)
