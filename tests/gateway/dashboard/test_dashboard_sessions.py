"""Dashboard sessions live in the auth store: on SQLite and PostgreSQL two gateways' stores share them, expiry
(idle and absolute) is enforced, revocation ends them; through the real app (on either database), a session
survives a restart and works on a second gateway over the same database, and a key revoked through one ends
it on the other."""

from __future__ import annotations

import re

import httpx
import pytest

from auth import AuthService
from auth.sessions import TOUCH_SECONDS, SessionStore
from gateway.dashboard.access import COOKIE
from testkit.databases import fresh_database
from tests.auth.helpers import PEPPER
from tests.gateway.dashboard.served import served_gateway, settings_in


class Clock:
    """The sessions' clock, moved by the test instead of waiting out an hour."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "postgres"])
async def two_services(request, tmp_path):
    """Two AuthServices over one database, as two gateway processes have."""
    async def opened(url: str):
        services = [await AuthService.open(url, PEPPER) for _ in range(2)]
        try:
            yield services
        finally:
            for service in services:
                await service.close()

    if request.param == "sqlite":
        async for services in opened(f"sqlite:///{tmp_path}/auth.db"):
            yield services
        return
    async with fresh_database(request.getfixturevalue("postgres"), "auth") as url:
        async for services in opened(url):
            yield services


async def a_key_id(service: AuthService) -> str:
    boot = await service.bootstrap(None)
    return (await service.authenticate(f"Bearer {boot.first_key}", None, "127.0.0.1")).key_id


async def test_a_session_is_shared_through_the_store_and_ends_everywhere(two_services):
    one = two_services[0]
    key_id = await a_key_id(one)
    clock = Clock()
    first, second = (SessionStore(s, idle=600, lifetime=3600, clock=clock) for s in two_services)
    session = await first.start(key_id=key_id)
    seen = await second.get(session.id)
    assert seen.signed_in and seen.key_id == key_id and seen.csrf == session.csrf  # the CSRF token too
    stored = repr(await one.store.db.fetchall("SELECT * FROM dashboard_sessions"))
    assert session.id not in stored and session.csrf not in stored  # a digest, never the cookie's id
    other = await second.start(key_id=key_id, is_admin=True)
    assert (await first.get(other.id)).is_admin
    await second.end(session.id)
    assert not (await first.get(session.id)).signed_in  # an anonymous visitor again, with the same cookie
    await first.end_key(key_id)
    assert not (await second.get(other.id)).signed_in


async def test_idle_and_absolute_expiry(two_services):
    service = two_services[0]
    key_id = await a_key_id(service)
    clock = Clock()
    sessions = SessionStore(service, idle=600, lifetime=3600, clock=clock)
    idle = await sessions.start(key_id=key_id)
    busy = await sessions.start(key_id=key_id)
    for _ in range(6):  # busy is read every 9 minutes for 54 minutes: never idle, then past its lifetime
        clock.now += 540
        assert (await sessions.get(busy.id)).signed_in
        if clock.now - 1_800_000_000.0 <= 600:
            assert (await sessions.get(idle.id)).signed_in
    assert not (await sessions.get(idle.id)).signed_in  # idle for > 600 s since its last read
    clock.now += 540
    assert not (await sessions.get(busy.id)).signed_in  # 63 minutes old, past its 60-minute lifetime
    fresh = await sessions.start(key_id=key_id)  # a sign-in sweeps the expired rows
    rows = await service.store.db.fetchall("SELECT id_hash FROM dashboard_sessions")
    assert len(rows) == 1 and (await sessions.get(fresh.id)).signed_in


async def test_reads_write_seen_at_at_most_once_a_minute(two_services):
    service = two_services[0]
    clock = Clock()
    sessions = SessionStore(service, clock=clock)
    session = await sessions.start(key_id=await a_key_id(service))
    seen = "SELECT seen_at FROM dashboard_sessions"
    clock.now += TOUCH_SECONDS / 2
    await sessions.get(session.id)
    assert (await service.store.db.fetchone(seen))[0] == clock.now - TOUCH_SECONDS / 2
    clock.now += TOUCH_SECONDS
    await sessions.get(session.id)
    assert (await service.store.db.fetchone(seen))[0] == clock.now


async def test_a_malformed_cookie_is_no_session(two_services):
    sessions = SessionStore(two_services[0])
    for cookie in ("", "x", "a" * 42, "a" * 44, "a" * 42 + "!", "../" * 15, "a" * 42 + "\u00e9"):
        assert await sessions.get(cookie) is None, cookie


async def sign_in(client: httpx.AsyncClient, key: str) -> None:
    page = await client.get("/dashboard/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    response = await client.post("/dashboard/login", data={"csrf": csrf, "api_key": key})
    assert response.status_code == 303 and response.headers["location"] == "/dashboard/overview"


async def overview_status(url: str, cookies: httpx.Cookies) -> int:
    async with httpx.AsyncClient(base_url=url, cookies=cookies) as client:
        return (await client.get("/dashboard/overview", follow_redirects=False)).status_code


@pytest.fixture(params=["sqlite", "postgres"])
async def database_url(request):
    """The gateways' database: "" is SQLite in their data dir."""
    if request.param == "sqlite":
        yield ""
        return
    async with fresh_database(request.getfixturevalue("postgres"), "auth") as url:
        yield url


async def test_a_session_survives_a_restart_and_serves_on_a_second_gateway(tmp_path, database_url):
    async with served_gateway(settings_in(tmp_path, database_url)) as first:
        team = (await first.admin("POST", "/admin/teams", name="Acme"))["id"]
        key = await first.admin("POST", "/admin/keys", name="k", team_id=team)
        async with httpx.AsyncClient(base_url=first.url) as client:
            await sign_in(client, key["key"])
            cookies = httpx.Cookies({COOKIE: client.cookies[COOKIE]})
        assert await overview_status(first.url, cookies) == 200
    async with served_gateway(settings_in(tmp_path, database_url)) as restarted, \
            served_gateway(settings_in(tmp_path, database_url)) as beside:
        assert await overview_status(restarted.url, cookies) == 200  # the restart signed nobody out
        assert await overview_status(beside.url, cookies) == 200  # another gateway on the same database
        await beside.admin("DELETE", f"/admin/keys/{key['id']}")
        assert await overview_status(restarted.url, cookies) == 302  # revoked through one, ended on the other
        assert await restarted.app.state.services.auth.store.db.fetchall("SELECT * FROM dashboard_sessions") == []
