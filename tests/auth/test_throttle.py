"""Failed authentication attempts are throttled per client address."""

from __future__ import annotations

import pytest

from auth import AuthError, AuthService
from auth.throttle import FailureThrottle
from tests.auth.conftest import PEPPER
from tests.auth.helpers import assert_envelope, bearer

BAD = "sk-sluice-000000000000-" + "a" * 32


async def test_brute_force_is_throttled_over_http(client):
    for _ in range(10):
        assert_envelope(await client.get("/v1/whoami", headers=bearer(BAD)), 401)
    response = await client.get("/v1/whoami", headers=bearer(BAD))
    error = assert_envelope(response, 429, "rate_limited")
    assert error["type"] == "rate_limit_exceeded" and int(response.headers["retry-after"]) >= 1
    # While throttled even a valid key is refused, so guesses teach nothing.
    assert_envelope(await client.get("/v1/whoami", headers=bearer(client.boot.first_key)), 429)
    assert_envelope(await client.get("/admin/keys", headers=client.admin_headers), 429)
    assert (await client.get("/v1/open")).status_code == 200


async def test_throttle_is_per_client(store_url):
    service = await AuthService.open(store_url, PEPPER, throttle=FailureThrottle(burst=3, per_minute=1))
    try:
        boot = await service.bootstrap(None)
        for _ in range(3):
            with pytest.raises(AuthError) as info:
                await service.authenticate(f"Bearer {BAD}", None, "10.0.0.66")
            assert info.value.status == 401
        with pytest.raises(AuthError) as info:
            await service.authenticate(f"Bearer {boot.first_key}", None, "10.0.0.66")
        assert info.value.status == 429 and info.value.retry_after > 0
        assert (await service.authenticate(f"Bearer {boot.first_key}", None, "10.0.0.7")).key_id
        # A missing key is not a guess and does not count.
        for _ in range(5):
            with pytest.raises(AuthError) as info:
                await service.authenticate(None, None, "10.0.0.8")
            assert info.value.status == 401
    finally:
        await service.close()


def test_bucket_refills():
    throttle = FailureThrottle(burst=2, per_minute=60)  # one attempt back per second
    throttle.failed("c", 0.0)
    throttle.failed("c", 0.0)
    assert throttle.retry_after("c", 0.0) == pytest.approx(1.0)
    assert throttle.retry_after("c", 0.5) == pytest.approx(0.5)
    assert throttle.retry_after("c", 1.0) is None
    assert throttle.retry_after("other", 0.0) is None


def test_throttle_memory_is_bounded():
    throttle = FailureThrottle(burst=1, per_minute=1, max_clients=100)
    for i in range(1000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}", 0.0)
    assert len(throttle._buckets) <= 100
