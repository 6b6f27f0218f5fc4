"""`GET /health_generate` without a working worker: 503, and the failed probe is shared like a good one (one
probe per interval, however many callers). Through the real ASGI app; the model's worker address answers
nothing. The end-to-end suite (tests/e2e/test_tenancy.py) proves the 200 side on the real model."""

from __future__ import annotations

import asyncio

from litestar.testing import AsyncTestClient

from gateway.config import Settings
from gateway.edge.app import create_app
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from gateway.metrics import REGISTRY
from testkit.servers import free_port


def failed_probes() -> float:
    return REGISTRY.get_sample_value("sluice_health_generate_probes_total", {"outcome": "failed"}) or 0.0


async def test_a_failed_probe_is_a_503_shared_by_every_caller_of_the_interval(tmp_path):
    model = EndpointSpec(name="m", provisioner=StaticProvisioning(urls=[f"http://127.0.0.1:{free_port()}"]))
    app = create_app(Settings(data_dir=str(tmp_path), models=[model], health_generate_interval_s=3600),
                     supervise=False)
    before = failed_probes()
    async with AsyncTestClient(app=app) as client:
        replies = await asyncio.gather(*(client.get("/health_generate") for _ in range(12)))
        assert [reply.status_code for reply in replies] == [503] * 12
        assert (await client.get("/health_generate")).status_code == 503
    assert failed_probes() - before == 1
