"""Where the gateway may call out to on a tenant's word: a spend budget's alert webhook and e-mail addresses
(`[budget_alerts]`). One rule, applied when a budget is set (every route that sets one calls `check_limits`)
and again when an alert is sent (`resolve_webhook`, whose address the sender then connects to):

- a webhook is `https://` (plain `http://` only with `allow_http_webhooks`), with a host and no credentials;
- its host is a name or a canonical IP address: numeric spellings that resolvers read as an address (`0x7f000001`,
  `2130706433`, `0177.0.0.1`, `127.1`) are refused outright;
- every address the host resolves to is public: not loopback, private, link-local, unique-local, site-local,
  multicast, unspecified, reserved or shared, and not an IPv6 form that carries such an IPv4 address (mapped `::ffff:`,
  compatible `::a.b.c.d`, NAT64 `64:ff9b::`, 6to4, Teredo); the operator may allow private networks by name
  (`webhook_networks`) and may restrict hosts to a list (`webhook_hosts`: `hooks.example.com` exactly,
  `.example.com` for its subdomains);
- at send time the sender resolves the host once, checks every address, and connects to the checked address
  itself (the URL's host stays the TLS name and the Host header), so a name that changes its answer between
  the check and the call (DNS rebinding) reaches nothing private.
- e-mail addresses set by a team's owner must be in an operator-allowed domain (`email_domains`; none by default:
  owners set no e-mail destinations, the operator's own budgets may name any address).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from auth.forwarded import parse_networks
from auth.models import HealthAlerts, Limits
from gateway.config import BudgetAlertSettings
from gateway.errors import BadRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
FIELD = "limits.spend_budget.webhook_url"
EMAILS = "limits.spend_budget.emails"
NOT_PUBLIC = ("the webhook's host is not a public address (loopback, private, link-local and other internal "
              "addresses are refused)")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_COMPATIBLE = ipaddress.ip_network("::/96")


class OutboundRefused(ValueError):
    """A destination the rule refuses; the message says why (never the resolved addresses)."""


class Unresolved(OSError):
    """The host does not resolve (now): a later try may succeed, and the next send checks again."""


@dataclass(frozen=True)
class OutboundRule:
    allow_http: bool = False
    hosts: tuple[str, ...] = ()  # empty: any public host
    networks: tuple[Any, ...] = ()  # IPv4Network | IPv6Network: private networks allowed (Any: Litestar's
    # signature model of a route that takes the rule refuses a union of two classes)
    email_domains: tuple[str, ...] = ()
    timeout_s: float = 5.0  # a resolution

    @classmethod
    def of(cls, settings: BudgetAlertSettings) -> OutboundRule:
        domains = tuple(d.lower().strip(".") for d in settings.email_domains)
        return cls(settings.allow_http_webhooks, tuple(_host_name(h) for h in settings.webhook_hosts),
                   parse_networks(settings.webhook_networks), domains, settings.timeout_s)


def _host_name(host: str) -> str:
    return host.strip().lower().rstrip(".")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries, for the forms that reach it (mapped, NAT64, 6to4, Teredo's
    client)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def is_public(ip: IPAddress) -> bool:
    """Globally routable unicast, checked through any IPv4 address an IPv6 form carries."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id or ip in _COMPATIBLE:  # `::a.b.c.d` (deprecated) and `::1` are never public
            return False
        if ip.is_site_local:  # fec0::/10: deprecated, yet routed inside some networks; `is_global` says yes
            return False
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            return is_public(embedded)
    return ip.is_global and not (ip.is_multicast or ip.is_unspecified or ip.is_loopback or ip.is_link_local
                                 or ip.is_private or ip.is_reserved)


def address_allowed(ip: IPAddress, rule: OutboundRule) -> bool:
    return is_public(ip) or any(ip in network for network in rule.networks)


def _literal(host: str) -> IPAddress | None:
    """The host as an IP address when it is one in canonical form; OutboundRefused for the other numeric
    spellings a resolver would also read as an address (hex, octal, a decimal integer, shortened forms)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        socket.inet_aton(host)
    except OSError:
        return None
    raise OutboundRefused("the webhook's host is a numeric address in a non-standard spelling: write an IP address "
                          "in dotted-decimal form, or use a host name")


def check_url(url: str, rule: OutboundRule) -> SplitResult:
    """The parts of a webhook URL the static rule allows (scheme, credentials, spelling, the host list)."""
    parts = urlsplit(url)
    if parts.scheme != "https" and not (parts.scheme == "http" and rule.allow_http):
        raise OutboundRefused("the webhook must be an https:// URL (plain http needs the gateway's "
                              "budget_alerts.allow_http_webhooks)")
    try:
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise OutboundRefused("the webhook's port is not a number from 1 to 65535") from None
    host = parts.hostname
    if not host or parts.username is not None or parts.password is not None:
        raise OutboundRefused("the webhook must be a URL with a host and no credentials")
    name = _host_name(host)
    if name == "localhost" or name.endswith(".localhost"):  # loopback by definition (RFC 6761), resolved or not
        raise OutboundRefused(NOT_PUBLIC)
    if rule.hosts and not any(name == h or (h.startswith(".") and name.endswith(h)) for h in rule.hosts):
        raise OutboundRefused("the webhook's host is not one the operator allows (budget_alerts.webhook_hosts)")
    _literal(host)
    return parts


def _port(parts: SplitResult) -> int:
    return parts.port or (443 if parts.scheme == "https" else 80)


async def resolve_webhook(url: str, rule: OutboundRule) -> tuple[SplitResult, IPAddress]:
    """The URL's parts and the one address to connect to, after the whole rule: every address the host
    resolves to must be allowed. OutboundRefused otherwise; Unresolved when it does not resolve."""
    parts = check_url(url, rule)
    host = parts.hostname or ""
    literal = _literal(host)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            found = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(
                host, _port(parts), type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP), rule.timeout_s)
        except (OSError, TimeoutError, UnicodeError):
            raise Unresolved("the webhook's host does not resolve") from None
        addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in found]
    if not addresses or not all(address_allowed(ip, rule) for ip in addresses):
        raise OutboundRefused(NOT_PUBLIC)
    return parts, addresses[0]


async def check_webhook(url: str, rule: OutboundRule) -> None:
    """The rule at the time a budget is set: a host that does not resolve yet is accepted (each send checks
    again); one that resolves to anything not allowed is refused."""
    with contextlib.suppress(Unresolved):
        await resolve_webhook(url, rule)


def pinned(parts: SplitResult, address: IPAddress) -> tuple[str, dict[str, str], dict[str, str]]:
    """The URL, headers and httpx extensions of a call to `parts` that connects to `address`, the one checked,
    never to a second answer of the resolver: the URL names the address, the Host header and the TLS name
    (`sni_hostname`, which the certificate is verified against) stay the URL's host."""
    host = parts.hostname or ""
    literal = isinstance(_literal(host), ipaddress.IPv6Address)
    name = f"[{host}]" if literal else host.encode("idna").decode("ascii")
    port = f":{parts.port}" if parts.port else ""
    checked = f"[{address}]" if address.version == 6 else str(address)
    url = parts._replace(netloc=f"{checked}{port}").geturl()
    extensions = {"sni_hostname": host if literal else name} if parts.scheme == "https" else {}
    return url, {"host": f"{name}{port}"}, extensions


def check_emails(emails: list[str], rule: OutboundRule, *, operator: bool) -> None:
    if operator or not emails:
        return
    for email in emails:
        domain = email.rpartition("@")[2].lower().rstrip(".")
        if not any(domain == d or domain.endswith("." + d) for d in rule.email_domains):
            raise OutboundRefused(f"alert e-mails may go only to the domains the operator allows "
                                  f"(budget_alerts.email_domains); {email[:254]!r} is not in one")


async def check_limits(limits: Limits | None, rule: OutboundRule, *, operator: bool) -> None:
    """Every route that stores limits calls this: 400 naming the field when the spend budget's webhook or
    e-mail addresses go somewhere the rule refuses."""
    budget = limits.spend_budget if limits is not None else None
    if budget is None:
        return
    if budget.webhook_url is not None:
        try:
            await check_webhook(budget.webhook_url, rule)
        except OutboundRefused as refusal:
            raise BadRequest(f"{FIELD}: {refusal}", param=FIELD) from None
    try:
        check_emails(list(budget.emails), rule, operator=operator)
    except OutboundRefused as refusal:
        raise BadRequest(f"{EMAILS}: {refusal}", param=EMAILS) from None


async def check_health_alerts(alerts: HealthAlerts | None, rule: OutboundRule, *, operator: bool) -> None:
    """As `check_limits`, for a team's health alerts (`PUT /v1/team/alerts`): 400 naming the field."""
    if alerts is None:
        return
    try:
        if alerts.webhook_url is not None:
            await check_webhook(alerts.webhook_url, rule)
    except OutboundRefused as refusal:
        raise BadRequest(f"webhook_url: {refusal}", param="webhook_url") from None
    try:
        check_emails(list(alerts.emails), rule, operator=operator)
    except OutboundRefused as refusal:
        raise BadRequest(f"emails: {refusal}", param="emails") from None
