"""Failed authentication attempts are throttled per client; a valid key is never refused for them."""

from __future__ import annotations

import pytest

from auth import AuthError, AuthService
from auth.forwarded import ClientAddresses
from auth.throttle import FailureThrottle
from tests.auth.helpers import PEPPER, assert_envelope, bearer

BAD = "sk-sluice-000000000000-" + "a" * 32


async def test_brute_force_is_throttled_over_http(client):
    for _ in range(10):
        assert_envelope(await client.get("/v1/whoami", headers=bearer(BAD)), 401)
    response = await client.get("/v1/whoami", headers=bearer(BAD))
    error = assert_envelope(response, 429, "rate_limited")
    assert error["type"] == "rate_limit_exceeded" and int(response.headers["retry-after"]) >= 1
    # Every failure of a throttled client is a 429, but a valid key from the same address still works:
    # behind NAT or a proxy, other customers share it.
    assert_envelope(await client.get("/v1/whoami", headers=bearer(BAD[:-1] + "b")), 429)
    assert (await client.get("/v1/whoami", headers=bearer(client.boot.first_key))).status_code == 200
    assert (await client.get("/admin/keys", headers=client.admin_headers)).status_code == 200
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
            await service.authenticate(f"Bearer {BAD}", None, "10.0.0.66")
        assert info.value.status == 429 and info.value.retry_after > 0
        assert (await service.authenticate(f"Bearer {boot.first_key}", None, "10.0.0.66")).key_id
        with pytest.raises(AuthError) as info:
            await service.authenticate(f"Bearer {BAD}", None, "10.0.0.7")
        assert info.value.status == 401
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


def test_forwarded_for_is_read_only_from_trusted_proxies():
    clients = ClientAddresses(["10.1.0.0/16", "2001:db8::/32"])
    assert clients.client("203.0.113.9", ["198.51.100.1"]) == "203.0.113.9"  # untrusted peer: header ignored
    assert clients.client("10.1.2.3", ["198.51.100.1"]) == "198.51.100.1"
    # the rightmost hop that is not a trusted proxy; what the client wrote on the left proves nothing
    assert clients.client("10.1.2.3", ["6.6.6.6, 198.51.100.1, 10.1.9.9"]) == "198.51.100.1"
    assert clients.client("10.1.2.3", ["6.6.6.6", "198.51.100.1"]) == "198.51.100.1"  # repeated headers
    assert clients.client("2001:db8::1", ["10.1.0.5, 2001:db8::2"]) == "10.1.0.5"  # only proxies: the first
    assert clients.client("10.1.2.3", []) == "10.1.2.3"
    assert clients.client("10.1.2.3", ["not-an-ip" * 20]) == ("not-an-ip" * 20)[:64]
    assert ClientAddresses().client("10.1.2.3", ["198.51.100.1"]) == "10.1.2.3"  # no proxies configured


def test_malformed_trusted_proxy_is_refused():
    with pytest.raises(ValueError, match="10.0.0.0/33"):
        ClientAddresses(["10.0.0.0/33"])
