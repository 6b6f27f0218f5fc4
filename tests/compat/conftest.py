"""Shared fixtures of the compatibility suites, one `sluice serve` per test module:

- `sluice_on_smol` (tests/conftest.py): the real gateway and worker with the default model (the real-SDK suites);
- `wire_served` (and its halves `server`, `worker`): the gateway on a protocol worker (testkit/protocol_worker.py)
  that plays the worker's side from a script, for the suites about the wire.

    def test_x(sluice_on_smol, auth_headers):       # a testkit.sluice.SluiceServer
        httpx.post(f"{sluice_on_smol.url}/v1/completions", headers=auth_headers, ...)
"""

from __future__ import annotations

import pytest

from testkit.protocol_worker import Reply, sluice_on_protocol_worker, tokens

WIRE_ADMIN_KEY = "compat-wire-admin-key-0123456789abcdef"


@pytest.fixture(scope="module")
def auth_headers(sluice_on_smol):
    return {"Authorization": f"Bearer {sluice_on_smol.api_key}"}


@pytest.fixture(scope="module")
def wire_served(tmp_path_factory):
    """`sluice serve` on a protocol worker, shared by the tests of one module: (server, worker)."""
    with sluice_on_protocol_worker(tmp_path_factory.mktemp("wire"), WIRE_ADMIN_KEY) as pair:
        yield pair


@pytest.fixture
def server(wire_served):
    """wire_served's server, its worker's script back to one plain answer and its request log cleared."""
    server, worker = wire_served
    worker.replies = [Reply(tokens())]
    worker.requests.clear()
    return server


@pytest.fixture
def worker(wire_served):
    return wire_served[1]
