"""The admin API of a running `sluice serve` (a testkit.sluice.SluiceServer), called as an operator calls it:
one `admin()` for every test and bench that makes teams and keys or reads the ledger over HTTP."""

from __future__ import annotations

import time

import httpx

from testkit.sluice import SluiceServer


def admin_headers(server: SluiceServer) -> dict[str, str]:
    return {"authorization": f"Bearer {server.admin_key}"}


def admin_request(server: SluiceServer, method: str, path: str, **body) -> httpx.Response:
    """One admin call with the server's admin key (`body`: the JSON body, none when empty); its response."""
    return httpx.request(method, f"{server.url}{path}", json=body or None, timeout=30, headers=admin_headers(server))


def admin(server: SluiceServer, method: str, path: str, **body) -> dict:
    """One admin call that must succeed; its JSON answer."""
    response = admin_request(server, method, path, **body)
    assert response.status_code < 300, response.text
    return response.json()


def default_team_key(server: SluiceServer, name: str, **limits) -> str:
    """A new service key of the default team with these limits (none given: the team's); its clear value."""
    teams = admin(server, "GET", "/admin/teams")["data"]
    team_id = next(t["id"] for t in teams if t["name"] == "default")
    fields = {"limits": limits} if limits else {}
    return admin(server, "POST", "/admin/keys", name=name, team_id=team_id, **fields)["key"]


def team_key(server: SluiceServer, name: str) -> str:
    """A new team named `name` and a service key of it (the team's default limits); the key's clear value."""
    team = admin(server, "POST", "/admin/teams", name=name)
    return admin(server, "POST", "/admin/keys", name=f"{name}-key", team_id=team["id"])["key"]


def ledger_records(server: SluiceServer) -> list[dict]:
    """Every record of the ledger, page after page (the records API answers one page at a time)."""
    records: list[dict] = []
    cursor = ""
    while True:
        body = admin(server, "GET", f"/admin/usage/records?start=2000-01-01&end=2100-01-01&limit=10000&cursor={cursor}")
        records.extend(body["data"])
        cursor = body.get("next_cursor")
        if not cursor:
            return records


def wait_for_records(server: SluiceServer, count: int, timeout: float = 120.0) -> list[dict]:
    """The ledger's records once it holds at least `count` (the shipper moves them from the WAL in batches), or
    what it holds after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        records = ledger_records(server)
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.3)
