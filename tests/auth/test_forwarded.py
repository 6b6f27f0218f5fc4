"""Who the client is: X-Forwarded-For read only from trusted proxies (what the failure budget and the audit log
count by). The failure budget itself is the gateway's `rejections_per_minute`: tests/gateway/test_one_owner.py."""

from __future__ import annotations

import pytest

from auth.forwarded import ClientAddresses


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
    # a dual-stack socket's peer, a proxy that writes brackets or ports: still the trusted proxy
    assert clients.client("::ffff:10.1.2.3", ["198.51.100.1"]) == "198.51.100.1"
    assert clients.client("10.1.2.3", ["198.51.100.1, [2001:db8::7]:443"]) == "198.51.100.1"


def test_malformed_trusted_proxy_is_refused():
    with pytest.raises(ValueError, match="10.0.0.0/33"):
        ClientAddresses(["10.0.0.0/33"])
