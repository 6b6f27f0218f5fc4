"""Tenant ↔ operator: `/metrics` and `/health` through the real `sluice serve` (in front of the stub worker).

`/metrics` describes every team's traffic and every endpoint, private ones included: it answers the
`metrics_token` or an admin key, nobody else. Its labels never carry what a caller wrote (the issue: 80
requests with invented model names made it 168 MB), so its size does not grow with the names callers
invent. `/health` tells anyone whether the gateway is ready, and only an admin key which endpoint is not."""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testkit.protocol_worker import WorkerProcess, worker_process
from testkit.servers import free_port
from testkit.sluice import SluiceServer, create_team_offline, running_sluice
from testkit.stub_gateway import ADMIN_KEY
from tests.faults.load import MODEL

TOKEN = "scrape-" + secrets.token_hex(16)
PRIVATE = "acme/secret-finetune"  # a private endpoint: its name is the operator's and its team's business


def config(stub_url: str, private_url: str, team_id: str) -> str:
    # the rejection budget lifted: the label test sends 80 invented names in a minute
    return (f'log_format = "json"\nmetrics_token = "{TOKEN}"\ndefault_team_limits = {{}}\n'
            'rejections_per_minute = 1000000\n'
            f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{stub_url}"] }}\n'
            f'[[models]]\nname = "{PRIVATE}"\nteam_id = "{team_id}"\n'
            f'provisioner = {{ kind = "static", urls = ["{private_url}"] }}\n')


@contextlib.contextmanager
def sluice(data_dir: Path, stub: WorkerProcess, private_url: str | None = None,
           wait: bool = True) -> Iterator[SluiceServer]:
    team = create_team_offline(data_dir, "acme")  # the private endpoint's owner
    with running_sluice(data_dir, config=config(stub.url, private_url or stub.url, team), wait=wait,
                        env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as server:
        yield server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with worker_process(token_delay=0.001) as stub, sluice(tmp_path_factory.mktemp("views"), stub) as running:
        yield running


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def scrape(server: SluiceServer) -> str:
    response = httpx.get(f"{server.url}/metrics", headers=bearer(TOKEN), timeout=30)
    assert response.status_code == 200, response.text
    return response.text


def requests_series(text: str) -> dict[str, float]:
    """sluice_requests_total's series (their label sets) and values."""
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("sluice_requests_total{")}


def test_metrics_answer_the_scrape_token_or_an_admin_key_only(server):
    url = f"{server.url}/metrics"
    nobody = httpx.get(url, timeout=30)
    assert nobody.status_code == 401 and nobody.json()["error"]["code"] == "missing_api_key"
    assert PRIVATE not in nobody.text
    wrong = httpx.get(url, headers=bearer(TOKEN + "x"), timeout=30)
    assert wrong.status_code == 401 and PRIVATE not in wrong.text
    tenant = httpx.get(url, headers=bearer(server.api_key), timeout=30)
    assert tenant.status_code == 403 and tenant.json()["error"]["code"] == "permission_denied"
    for key in (TOKEN, ADMIN_KEY):
        allowed = httpx.get(url, headers=bearer(key), timeout=30)
        assert allowed.status_code == 200 and "sluice_endpoint_state" in allowed.text


def test_metric_labels_never_carry_a_callers_model(server):
    def invent(count: int) -> list[httpx.Response]:
        with httpx.Client(base_url=server.url, headers=bearer(server.api_key), timeout=30) as client:
            return [client.post("/v1/completions", json={"model": f"invented-{secrets.token_hex(8)}-{'x' * 50_000}",
                                                         "prompt": "hi", "max_tokens": 2})
                    for _ in range(count)]

    ok = httpx.post(f"{server.url}/v1/completions", headers=bearer(server.api_key), timeout=30,
                    json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200
    assert {r.status_code for r in invent(40)} == {404}
    first = scrape(server)
    assert "invented-" not in first and len(first) < 256 * 1024
    unknown = 'sluice_requests_total{dialect="openai",model="unknown",route="/v1/completions",status="rejected"}'
    assert requests_series(first)[unknown] >= 40
    assert any(f'model="{MODEL}"' in series for series in requests_series(first))
    assert {r.status_code for r in invent(40)} == {404}
    second = scrape(server)
    assert "invented-" not in second
    assert requests_series(second).keys() == requests_series(first).keys()  # no series per invented name
    assert requests_series(second)[unknown] == requests_series(first)[unknown] + 40
    assert abs(len(second) - len(first)) < 4096  # the same series, other counts


def test_health_says_ok_to_anyone_and_names_endpoints_to_an_admin(server):
    for path in ("/health", "/v1/completions/health"):
        for headers in ({}, bearer(server.api_key)):  # no key, a tenant's key
            public = httpx.get(f"{server.url}{path}", headers=headers, timeout=30)
            assert public.status_code == 200 and public.json() == {"status": "ok"}, public.text
    detail = httpx.get(f"{server.url}/health", headers=bearer(ADMIN_KEY), timeout=30).json()
    assert detail["endpoints"] == {MODEL: "ready", PRIVATE: "ready"}


def test_an_unready_gateway_says_503_and_names_the_endpoint_to_an_admin_only(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"  # the private endpoint's only replica answers nothing
    with worker_process() as stub, sluice(tmp_path, stub, private_url=dead, wait=False) as server:
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline and server.process.poll() is None, server.output[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server.url}/health", timeout=2).status_code == 503:
                    break
            time.sleep(0.25)
        for path in ("/health", "/v1/completions/health"):
            public = httpx.get(f"{server.url}{path}", timeout=30)
            assert public.status_code == 503 and "retry-after" in public.headers
            assert PRIVATE not in public.text and not re.search(r"stub|acme", public.text), public.text
            admin = httpx.get(f"{server.url}{path}", headers=bearer(ADMIN_KEY), timeout=30)
            assert admin.status_code == 503 and PRIVATE in admin.text
