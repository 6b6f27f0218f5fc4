"""The client a request comes from, for the failed-auth throttle and the audit log.

Behind a load balancer every request arrives from the balancer's address, so the real client is read from
`X-Forwarded-For`, but only when the peer is one of the configured trusted proxies (anyone else could write
any address there). The client is the rightmost hop that is not itself a trusted proxy: each trusted proxy
appends the address it saw, so everything left of that hop was written by the client and proves nothing."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

MAX_HOP_CHARS = 64  # an unparsable hop is kept as the client's name, bounded
IPV6_CLIENT_PREFIX = 64  # one subscriber (a home, a VM) is given a whole /64


def client_group(address: str) -> str:
    """What a per-client bound counts for `address`: an IPv4 address itself, an IPv6 address's /64 (counting
    single IPv6 addresses would bound nothing: a /64 holds 2^64 of them), an IPv4-mapped IPv6 address as its
    IPv4 address; anything that is not an address as itself. A hop some proxies write with brackets or a port
    (`[2001:db8::1]:50123`, `198.51.100.7:50123`) is its address: with the port each connection would be a client."""
    ip = _address(address.strip())
    if ip is None:
        return address
    if isinstance(ip, ipaddress.IPv6Address):  # (an IPv4-mapped one is its IPv4 address already: `_address`)
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, IPV6_CLIENT_PREFIX)))
    return str(ip)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`text` as an IP address, also bracketed or followed by a port; None when it is none of these."""
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # IPv4 with a port (an IPv6 address has at least two colons)
        text = text.partition(":")[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # a dual-stack socket's spelling of an IPv4 peer (a trusted proxy's, say)
    return ip


def parse_networks(cidrs: Iterable[str]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """CIDRs (or single addresses) → networks; a malformed one raises ValueError naming it."""
    networks = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{cidr!r} is not an IP address or CIDR network (e.g. 10.0.0.0/8)") from None
    return tuple(networks)


class ClientAddresses:
    def __init__(self, trusted_proxies: Iterable[str] = ()) -> None:
        self._trusted = parse_networks(trusted_proxies)

    def trusted(self, address: str) -> bool:
        ip = _address(address.strip())
        return ip is not None and any(ip in network for network in self._trusted)

    def client(self, peer: str, forwarded_for: Sequence[str]) -> str:
        """`peer`: the TCP peer's address; `forwarded_for`: every `X-Forwarded-For` header value, in order."""
        if not self._trusted or not self.trusted(peer):
            return peer
        hops = [hop.strip() for value in forwarded_for for hop in value.split(",") if hop.strip()]
        for hop in reversed(hops):
            if not self.trusted(hop):
                return hop[:MAX_HOP_CHARS]
        return hops[0][:MAX_HOP_CHARS] if hops else peer  # only trusted proxies: the first of them
