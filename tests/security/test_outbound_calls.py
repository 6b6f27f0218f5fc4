"""Tenant ↔ the platform's network: a budget alert is the one call the gateway makes on a tenant's word, and it
goes only to public addresses the operator allows (gateway/serving/outbound.py). A local TCP listener stands for
every internal service; the owner of a team and the operator point webhooks at it through every spelling of
loopback and of the other internal ranges, through each route that sets a budget, and a sender whose resolver
changes its answer between two calls (DNS rebinding); no connection ever reaches the listener. Alert e-mails set
by an owner go only to the domains the operator allows."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
from collections.abc import Iterator

import httpx
import msgspec
import pytest

from auth.models import Limits, SpendBudget
from gateway.config import BudgetAlertSettings
from gateway.errors import BadRequest
from gateway.serving.budget_alerts import Alert, AlertSender
from gateway.serving.outbound import OutboundRule, address_allowed, check_limits
from testkit.admin import admin
from tests.security.stub_served import stub_served

ADMIN_KEY = "outbound-calls-admin-key-0123456789abcdef"
DOLLAR = 1_000_000


class Listener:
    """A TCP listener on loopback (IPv4, and IPv6 where the host has it) that counts the connections it gets."""

    def __init__(self) -> None:
        self.accepted = 0
        self._v4 = socket.create_server(("127.0.0.1", 0))
        self.port = self._v4.getsockname()[1]
        self._sockets = [self._v4]
        with contextlib.suppress(OSError):
            self._sockets.append(socket.create_server(("::1", self.port), family=socket.AF_INET6))
        self._stop = False
        self._threads = [threading.Thread(target=self._accept, args=(s,), daemon=True) for s in self._sockets]
        for thread in self._threads:
            thread.start()

    def _accept(self, server: socket.socket) -> None:
        server.settimeout(0.1)
        while not self._stop:
            try:
                connection, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self._stop = True
        for thread in self._threads:
            thread.join(timeout=5)
        for server in self._sockets:
            server.close()


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    running = Listener()
    yield running
    running.close()


def spellings(port: int) -> list[str]:
    """Loopback, and the other internal ranges, as a tenant may write them in a webhook URL."""
    loopback = ["127.0.0.1", "localhost", "LOCALHOST.", "127.0.0.2", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]",
                "[0:0:0:0:0:ffff:7f00:1]", "0x7f000001", "0x7F.0.0.1", "2130706433", "0177.0.0.1", "0177.1",
                "127.1", "[::1]", "[::127.0.0.1]", "[64:ff9b::7f00:1]", "[2002:7f00:1::]",
                "[2001::80ff:fffe]", "0.0.0.0", "0", "[::]"]  # (2001::/32: Teredo, its client 127.0.0.1 inverted)
    internal = ["10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "[fe80::1]", "[fd00::1]",
                "224.0.0.1", "[ff02::1]", "[::ffff:169.254.169.254]", "[::ffff:a9fe:a9fe]", "0xa9fea9fe",
                "[fec0::1]", "[64:ff9b:1::a9fe:a9fe]"]  # site-local (deprecated, still routed inside), local NAT64
    return [f"https://{host}:{port}/hook" for host in loopback] + [f"https://{host}/hook" for host in internal]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with stub_served(tmp_path_factory.mktemp("outbound"), ADMIN_KEY) as running:
        yield running


@pytest.fixture(scope="module")
def owner(server) -> tuple[str, str]:
    """(the owner's key, a service key id of the owner's team)."""
    team = admin(server, "POST", "/admin/teams", name="hooks")["id"]
    user = admin(server, "POST", "/admin/users", name="olive")["id"]
    admin(server, "PUT", f"/admin/teams/{team}/members/{user}", role="owner")
    key = admin(server, "POST", "/admin/keys", name="olive", team_id=team, user_id=user)["key"]
    service = admin(server, "POST", "/admin/keys", name="svc", team_id=team)["id"]
    return key, service


def call(server, key: str, method: str, path: str, **body) -> httpx.Response:
    return httpx.request(method, f"{server.url}{path}", json=body, timeout=30,
                         headers={"authorization": f"Bearer {key}"})


def budget(**fields) -> dict:
    return {"spend_budget": {"amount_micros": DOLLAR, "hard": False, **fields}}


def setters(server, owner) -> list:
    """Every route that stores a spend budget: (who, method, path, extra body)."""
    key, service = owner
    team = admin(server, "POST", "/admin/teams", name="target")["id"]
    return [(ADMIN_KEY, "POST", "/admin/teams", {"name": "t"}), (ADMIN_KEY, "PATCH", f"/admin/teams/{team}", {}),
            (ADMIN_KEY, "POST", "/admin/keys", {"name": "k", "team_id": team}),
            (key, "POST", "/v1/team/keys", {"name": "k"}), (key, "PATCH", f"/v1/team/keys/{service}", {})]


def test_no_route_stores_a_webhook_to_an_internal_address(server, owner, listener):
    routes = setters(server, owner)
    for url in spellings(listener.port):
        for who, method, path, extra in routes:
            answer = call(server, who, method, path, **extra, limits=budget(webhook_url=url))
            assert answer.status_code == 400, (url, method, path, answer.text)
            assert answer.json()["error"]["param"] == "limits.spend_budget.webhook_url", answer.text
    assert listener.accepted == 0
    # a public host is taken on every route (resolved or not: each send checks again)
    for who, method, path, extra in routes:
        answer = call(server, who, method, path, **extra, limits=budget(webhook_url="https://hooks.example/b"))
        assert answer.status_code in (200, 201), (method, path, answer.text)


def test_the_teams_own_alert_routes_store_no_internal_destination(server, owner, listener):
    """`PUT /v1/team/budgets` and `PUT /v1/team/alerts` (a team's health alerts) keep the same rule: every
    spelling of an internal address, plain http and an e-mail outside the allowed domains are 400s naming the
    field, for an owner whose team has a ceiling (so the budget route would store)."""
    key, _ = owner
    team = call(server, key, "GET", "/v1/team").json()["id"]
    admin(server, "PATCH", f"/admin/teams/{team}", limits={"ceiling": {"spend_micros": 100 * DOLLAR}})
    routes = (("/v1/team/budgets", lambda **f: {"spend_budget": {"amount_micros": DOLLAR, "hard": True, **f}},
               "limits.spend_budget."),
              ("/v1/team/alerts", lambda **f: {"error_rate_percent": 30, **f}, ""))
    for path, body, prefix in routes:
        for url in [*spellings(listener.port), "http://hooks.example/b"]:
            answer = call(server, key, "PUT", path, **body(webhook_url=url))
            assert answer.status_code == 400, (url, path, answer.text)
            assert answer.json()["error"]["param"] == f"{prefix}webhook_url", answer.text
        answer = call(server, key, "PUT", path, **body(emails=["anyone@victim.example"]))
        assert answer.status_code == 400 and answer.json()["error"]["param"] == f"{prefix}emails", answer.text
        answer = call(server, key, "PUT", path, **body(webhook_url="https://hooks.example/b"))
        assert answer.status_code == 200, (path, answer.text)
    assert listener.accepted == 0


def test_patch_refuses_plain_http_as_post_does(server, owner):
    key, service = owner
    for method, path in (("POST", "/v1/team/keys"), ("PATCH", f"/v1/team/keys/{service}")):
        answer = call(server, key, method, path, name="k", limits=budget(webhook_url="http://hooks.example/b"))
        assert answer.status_code == 400 and "https" in answer.text, (method, answer.text)
    stored = call(server, key, "GET", "/v1/team/keys").json()["data"]
    assert not any("http://" in str(k["limits"]) for k in stored)


def test_an_owner_sends_alert_emails_only_to_allowed_domains(server, owner):
    key, service = owner
    for method, path in (("POST", "/v1/team/keys"), ("PATCH", f"/v1/team/keys/{service}")):
        answer = call(server, key, method, path, name="k", limits=budget(emails=["anyone@victim.example"]))
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "limits.spend_budget.emails"
    # the operator's own budgets may name any address
    team = admin(server, "POST", "/admin/teams", name="mailed", limits=budget(emails=["cfo@acme.example"]))
    assert team["limits"]["spend_budget"]["emails"] == ["cfo@acme.example"]


def alert() -> Alert:
    return Alert("team:t", "month", "2026-12", "2027-01-01T00:00:00Z", 50, DOLLAR, DOLLAR // 2, False,
                 "2026-12-06T00:00:00Z")


async def test_the_sender_checks_again_and_reaches_no_internal_address(listener):
    """A budget stored before the rule (or a name that now resolves inside): the sender refuses it."""
    sender = AlertSender(BudgetAlertSettings(timeout_s=1.0, attempts=1))
    try:
        for url in spellings(listener.port):
            await sender.send(alert(), url, [])
    finally:
        await sender.close()
    assert listener.accepted == 0
    # the listener does count: the operator's allowed network reaches it
    # the listener closes what it accepts, so the send ends then; a short timeout would race its accept
    allowed = AlertSender(BudgetAlertSettings(timeout_s=30.0, attempts=1, webhook_networks=["127.0.0.0/8"]))
    try:
        await allowed.send(alert(), f"https://127.0.0.1:{listener.port}/hook", [])
    finally:
        await allowed.close()
    assert listener.accepted == 1
    listener.accepted = 0


async def test_a_name_that_rebinds_to_loopback_reaches_nothing(listener):
    """The resolver answers a public address, then loopback (DNS rebinding): the sender connects to the address
    it checked, never to a second answer."""
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo
    answers = 0

    async def rebinding(host, port, *args, **kwargs):
        nonlocal answers
        if (host.decode() if isinstance(host, bytes) else host) != "rebind.example":  # (anyio passes bytes)
            return await real(host, port, *args, **kwargs)
        answers += 1
        address = "192.88.99.1" if answers % 2 else "127.0.0.1"  # public (no route here), then loopback
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]

    loop.getaddrinfo = rebinding
    sender = AlertSender(BudgetAlertSettings(timeout_s=1.0, attempts=3))
    try:
        await sender.send(alert(), f"https://rebind.example:{listener.port}/hook", [])
    finally:
        await sender.close()
        del loop.getaddrinfo
    assert answers >= 1 and listener.accepted == 0


async def test_the_operators_lists_narrow_and_widen_the_rule():
    rule = OutboundRule.of(BudgetAlertSettings(webhook_hosts=["hooks.example", ".corp.example"],
                                               webhook_networks=["10.20.0.0/16"], email_domains=["acme.example"]))

    async def refused(url: str | None = None, emails: tuple[str, ...] = (), operator: bool = False) -> str | None:
        limits = Limits(spend_budget=SpendBudget(amount_micros=DOLLAR, webhook_url=url, emails=list(emails)))
        try:
            await check_limits(limits, rule, operator=operator)
        except BadRequest as refusal:
            return refusal.param
        return None

    assert await refused("https://hooks.example/a") is None
    assert await refused("https://eu.corp.example/a") is None
    assert await refused("https://other.example/a") == "limits.spend_budget.webhook_url"
    assert await refused("https://10.20.3.4/a") == "limits.spend_budget.webhook_url"  # a network, not a host
    assert await refused(emails=("ops@acme.example", "cfo@eu.acme.example")) is None
    assert await refused(emails=("ops@acme.example.evil.example",)) == "limits.spend_budget.emails"
    assert await refused(emails=("anyone@evil.example",), operator=True) is None
    open_rule = OutboundRule.of(BudgetAlertSettings(webhook_networks=["10.20.0.0/16"]))
    assert address_allowed(ipaddress.ip_address("10.20.3.4"), open_rule)
    assert not address_allowed(ipaddress.ip_address("10.21.0.1"), open_rule)
    with pytest.raises(msgspec.ValidationError, match="not an IP address or CIDR"):
        msgspec.convert({"webhook_networks": ["10.0.0.0/33"]}, BudgetAlertSettings)
