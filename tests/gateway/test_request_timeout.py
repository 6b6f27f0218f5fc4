"""A generation may run `request_timeout_s` once admitted, and its concurrency slot's lease is that plus a margin:
a request past the limit is ended (504, or the stream's error event), its worker let go and its slot settled, so
no live request ever outlives its lease (which would free its slot while it still runs)."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from gateway.config import LEASE_MARGIN_S, Settings, load_settings
from testkit.protocol_worker import Reply, tokens
from tests.gateway.app_client import app_client, new_key
from tests.gateway.generation_bodies import body

# two tokens, then nothing until the test ends: it cannot finish within any limit, however the machine runs
SLOW = Reply(tokens("one two three four five six seven eight nine ten"), hold_after=3)
LIMIT = 1.0
FAST_LIMIT = 5.0  # where a fast request must be served within the limit too, on a loaded machine


@pytest.fixture
async def short_gateway(gateway_settings):
    async with app_client(msgspec.structs.replace(gateway_settings, request_timeout_s=LIMIT)) as client:
        yield client


async def wait_until(condition, seconds: float = 60.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the condition never held")


@pytest.mark.parametrize("path", ["/v1/completions", "/generate", "/v1/completions/generate"])
async def test_a_request_past_the_limit_is_a_504_and_lets_its_worker_go(short_gateway, worker, path):
    worker.replies = [SLOW]
    response = await short_gateway.post(path, json=body(path), headers=short_gateway.key_headers)
    assert response.status_code == 504, response.text
    assert "request_timeout_s" in response.text and response.headers["x-should-retry"] == "false"
    await wait_until(lambda: worker.disconnected == [True])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/generate_stream"])
async def test_a_stream_past_the_limit_ends_with_an_error(short_gateway, worker, path):
    worker.replies = [SLOW]
    response = await short_gateway.post(path, json=body(path, stream=True), headers=short_gateway.key_headers)
    assert response.status_code == 200
    last = json.loads([line for line in response.text.splitlines() if line.startswith("data:")][-1][5:])
    assert "request_timeout_s" in json.dumps(last)
    assert " ten" not in response.text  # the last word never came
    await wait_until(lambda: worker.disconnected == [True])


async def test_the_slot_of_a_timed_out_request_is_free_at_once(gateway_settings, worker):
    async with app_client(msgspec.structs.replace(gateway_settings, request_timeout_s=FAST_LIMIT)) as gateway:
        headers = await new_key(gateway, limits={"max_concurrency": 1})
        worker.replies = [SLOW, Reply(tokens())]
        assert (await gateway.post("/generate", json=body("/generate"), headers=headers)).status_code == 504
        assert (await gateway.post("/generate", json=body("/generate"), headers=headers)).status_code == 200


async def test_the_lease_and_the_worker_reads_agree_with_the_limit(short_gateway, gateway_settings):
    services = short_gateway.app.state.services
    assert services.settings.concurrency_lease_s == LIMIT + LEASE_MARGIN_S
    assert services.limiter._lease_us == int((LIMIT + LEASE_MARGIN_S) * 1_000_000)
    replica = next(iter(services.router.pools.values())).replicas[0]
    assert replica.worker.read_timeout == LIMIT
    assert Settings().concurrency_lease_s == 900.0  # the default: 840 s of request, the 900 s lease as before


@pytest.mark.parametrize("value", ["0", "-1", "1e9"])
def test_a_bad_request_timeout_stops_the_start_with_one_line(tmp_path, value):
    config = tmp_path / "sluice.toml"
    config.write_text(f"request_timeout_s = {value}\n")
    with pytest.raises(SystemExit, match="request_timeout_s"):
        load_settings(str(config))
