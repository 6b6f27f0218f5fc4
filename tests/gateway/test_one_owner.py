"""One owner per fact (issue #46, item 3), each proven through the real gateway app: the limiter's series are in
the registry `/metrics` renders (they sat in prometheus_client's default one, which nothing scrapes), and
`rejections_per_minute` is what refuses bad keys (a hard-coded per-process throttle, 10 then 429, answered
first whatever the setting said), and one readiness rule answers every health route."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from gateway.endpoints.spec import parse_endpoint
from tests.gateway.app_client import app_client

BAD_KEY = {"authorization": "Bearer sk-sluice-000000000000-" + "a" * 32}


@pytest.mark.parametrize("budget", [3, 25])
async def test_rejections_per_minute_is_the_one_rule_for_bad_keys(gateway_settings, budget):
    """25 is above the old throttle's 10 (its 11th answer was a 429), 3 below it."""
    async with app_client(msgspec.structs.replace(gateway_settings, rejections_per_minute=budget)) as client:
        statuses = [(await client.get("/v1/models", headers=BAD_KEY)).status_code for _ in range(budget)]
        assert statuses == [401] * budget
        refused = await client.get("/v1/models", headers=BAD_KEY)
        assert refused.status_code == 429 and float(refused.headers["retry-after"]) > 0, refused.text
        assert (await client.get("/v1/models")).status_code == 429  # a missing key counts against the same budget
        # a valid key from the same client is never refused for others' failures
        assert (await client.get("/v1/models", headers=client.key_headers)).status_code == 200


async def test_the_limiters_series_reach_metrics(gateway_settings):
    async with app_client(msgspec.structs.replace(gateway_settings, rejections_per_minute=1)) as client:
        for _ in range(2):  # the second is over the budget: the limiter refuses it
            await client.get("/v1/models", headers=BAD_KEY)
        scraped = await client.get("/metrics", headers=client.admin_headers)
        assert scraped.status_code == 200, scraped.text
        samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in scraped.text.splitlines()
                   if line and not line.startswith("#")}
        assert samples.get('sluice_limiter_rejections_total{kind="rate_limit"}', 0) >= 1, [
            line for line in scraped.text.splitlines() if "limiter" in line]


async def test_health_routes_agree_on_an_endpoint_at_zero(gateway_settings, tmp_path):
    """One readiness rule (gateway/serving/readiness.py): an endpoint that may sleep is ready at zero for
    `/health` and DataCrunch's `/v1/completions/health` alike (the latter said 503)."""
    sleeping = parse_endpoint({"name": "org/sleepy", "source": str(tmp_path / "unused"), "min_replicas": 0})
    settings = msgspec.structs.replace(gateway_settings, models=[*gateway_settings.models, sleeping])
    async with app_client(settings) as client:
        deadline = time.monotonic() + 120
        while (await client.get("/health")).status_code != 200:  # the protocol worker's endpoint comes up
            assert time.monotonic() < deadline, (await client.get("/health", headers=client.admin_headers)).text
            await asyncio.sleep(0.05)
        detail = (await client.get("/health", headers=client.admin_headers)).json()
        assert detail["endpoints"]["org/sleepy"] == "scaled_to_zero", detail
        for headers in ({}, client.admin_headers):
            answer = await client.get("/v1/completions/health", headers=headers)
            assert answer.status_code == 200 and answer.json() == {"status": "ok"}, answer.text
