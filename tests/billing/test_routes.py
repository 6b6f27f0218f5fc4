"""The usage API over HTTP (Litestar test client), on both stores."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import pytest
from litestar import Litestar
from litestar.connection import ASGIConnection
from litestar.di import Provide
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult

from auth import AuthError
from auth.middleware import require_admin
from billing.routes import admin_usage_router, usage_router
from gateway.dialects.base import DEFAULT
from tests.billing.factory import usage


@dataclass
class Principal:
    team_id: str
    key_id: str
    is_admin: bool = False


PRINCIPALS = {"Bearer a": Principal("team-a", "key-a"), "Bearer b": Principal("team-b", "key-b"),
              "Bearer root": Principal("ops", "key-root", is_admin=True)}


class StandInAuthentication(AbstractAuthenticationMiddleware):
    """Sets `request.user` as the gateway's API-key middleware does, from a fixed table (the usage API is
    tested end to end through the real gateway in tests/e2e)."""

    async def authenticate_request(self, connection: ASGIConnection) -> AuthenticationResult:
        principal = PRINCIPALS.get(connection.headers.get("authorization", ""))
        if principal is None:
            raise AuthError.invalid_key()
        return AuthenticationResult(user=principal, auth=principal.key_id)


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.fixture
async def client(ledger):
    records = [
        usage(team_id="team-a", key_id="key-a", model="small", time=ts("2025-03-01T10:00:00"), prompt_tokens=100,
              completion_tokens=10, compute_tokens=30),
        usage(team_id="team-a", key_id="key-a2", model="big", time=ts("2025-03-01T23:59:59"), prompt_tokens=200,
              completion_tokens=20, compute_tokens=20),
        usage(team_id="team-a", key_id="key-a", model="small", time=ts("2025-03-02T00:00:00"), prompt_tokens=1,
              completion_tokens=1, compute_tokens=1, status="cancelled"),
        usage(team_id="team-a", key_id="key-a", model="small", time=ts("2025-03-02T05:00:00"), status="rejected",
              prompt_tokens=0, completion_tokens=0, compute_tokens=0),
        usage(team_id="team-b", key_id="key-b", model="small", time=ts("2025-03-01T12:00:00"), prompt_tokens=5000,
              completion_tokens=500, compute_tokens=500),
    ]
    for r in records:
        await ledger.record(r)
    await ledger.flush(10)
    app = Litestar(route_handlers=[usage_router(), admin_usage_router(guards=[require_admin])],
                   middleware=[StandInAuthentication], exception_handlers=DEFAULT.exception_handlers(),
                   dependencies={"ledger": Provide(lambda: ledger, sync_to_thread=False)})
    # httpx's ASGI transport runs the app on this test's loop, where the database pool lives
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        yield c


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_team_usage_by_day_only_sees_own_team(client):
    r = await client.get("/v1/usage", params={"start": "2025-03-01", "end": "2025-03-02", "group_by": "day"},
                         headers=auth("a"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["team_id"] == "team-a"
    assert [(row["key"], row["requests"], row["prompt_tokens"]) for row in body["rows"]] == [
        ("2025-03-01", 2, 300), ("2025-03-02", 2, 1)]
    totals = body["totals"]
    assert (totals["requests"], totals["prompt_tokens"], totals["completion_tokens"], totals["compute_tokens"]) == (
        4, 301, 31, 51)
    # small: 100*0.1 + 30*0.4 = 22; big: 200*3 + 20*15 = 900; cancelled: (0.1 + 0.4) rounds to 1
    assert totals["cost_micros"] == 22 + 900 + 1 == sum(row["cost_micros"] for row in body["rows"])
    assert totals["cost"] == "0.000923"


async def test_end_date_includes_its_day_and_datetimes_are_instants(client):
    r = await client.get("/v1/usage", params={"start": "2025-03-01", "end": "2025-03-01", "group_by": "model"},
                         headers=auth("a"))
    assert [(row["key"], row["requests"]) for row in r.json()["rows"]] == [("big", 1), ("small", 1)]
    r = await client.get("/v1/usage", params={"start": "2025-03-01T11:00:00+01:00", "end": "2025-03-02T00:00:00Z",
                                              "group_by": "key"}, headers=auth("a"))
    assert [(row["key"], row["requests"]) for row in r.json()["rows"]] == [("key-a", 1), ("key-a2", 1)]


@pytest.mark.parametrize("params, param", [
    ({"start": "yesterday"}, "start"), ({"end": "2025-13-01"}, "end"), ({"group_by": "team"}, "group_by"),
    ({"start": "2025-03-05", "end": "2025-03-01"}, "end"), ({"group_by": "weekday"}, "group_by"),
    ({"format": "csv"}, "format"),
])
async def test_bad_parameters_answer_400_naming_the_field(client, params, param):
    r = await client.get("/v1/usage", params=params, headers=auth("a"))
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


async def test_unauthenticated_is_401_in_envelope(client):
    r = await client.get("/v1/usage", headers=auth("nope"))
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


async def test_admin_usage_needs_admin(client):
    r = await client.get("/admin/usage", headers=auth("a"))
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"


async def test_admin_usage_across_teams_and_filtered(client):
    params = {"start": "2025-03-01", "end": "2025-03-02", "group_by": "team"}
    r = await client.get("/admin/usage", params=params, headers=auth("root"))
    assert [(row["key"], row["requests"]) for row in r.json()["rows"]] == [("team-a", 4), ("team-b", 1)]
    r = await client.get("/admin/usage", params={**params, "team_id": "team-b", "group_by": "none"},
                         headers=auth("root"))
    assert r.json()["totals"]["prompt_tokens"] == 5000


async def test_admin_csv_export_matches_json(client):
    params = {"start": "2025-03-01", "end": "2025-03-02", "group_by": "model"}
    as_json = (await client.get("/admin/usage", params=params, headers=auth("root"))).json()
    r = await client.get("/admin/usage", params={**params, "format": "csv"}, headers=auth("root"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [(row["model"], int(row["requests"]), int(row["cost_micros"]), row["cost"]) for row in rows] == [
        (row["key"], row["requests"], row["cost_micros"], row["cost"]) for row in as_json["rows"]]
