"""Small helpers for driving the admin API in the auth tests, and the pepper their key hashes use."""

from __future__ import annotations

PEPPER = b"test-pepper-0123456789abcdef"


async def make_user(client, name: str = "alice") -> str:
    response = await client.post("/admin/users", json={"name": name}, headers=client.admin_headers)
    assert response.status_code == 201, response.text
    return response.json()["id"]


async def make_team(client, name: str, limits: dict | None = None) -> str:
    body = {"name": name} | ({"limits": limits} if limits is not None else {})
    response = await client.post("/admin/teams", json=body, headers=client.admin_headers)
    assert response.status_code == 201, response.text
    return response.json()["id"]


async def add_member(client, team_id: str, user_id: str, role: str = "member") -> None:
    response = await client.put(f"/admin/teams/{team_id}/members/{user_id}", json={"role": role},
                                headers=client.admin_headers)
    assert response.status_code == 200, response.text


async def make_key(client, **body) -> dict:
    body.setdefault("name", "k")
    response = await client.post("/admin/keys", json=body, headers=client.admin_headers)
    assert response.status_code == 201, response.text
    return response.json()


def bearer(key: str, team: str | None = None, alias: bool = False) -> dict:
    headers = {"Authorization": f"Bearer {key}"}
    if team is not None:
        headers["X-Friendli-Team" if alias else "X-Team-Id"] = team
    return headers


def assert_envelope(response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error
