"""The dashboard's forms refuse what is not a form of this session, never with a 500: a missing or forged
CSRF token, another content type, an oversized or undecodable body, an empty or absurd key."""

from __future__ import annotations

import re

import httpx
import pytest

from gateway.dashboard.access import MAX_FORM_BYTES
from tests.gateway.dashboard.served import ADMIN_KEY

FORM = "application/x-www-form-urlencoded"


async def signed_out_session(client: httpx.AsyncClient) -> str:
    page = await client.get("/dashboard/login")
    assert page.status_code == 200 and "sluice_session" in client.cookies
    return re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)


@pytest.mark.parametrize("body, content_type, status, words", [
    (b'{"api_key": "x"}', "application/json", 415, "application/x-www-form-urlencoded"),
    (b"api_key=x", FORM, 403, "reload the page"),  # no token
    (b"csrf=forged&api_key=x", FORM, 403, "reload the page"),
    (b"csrf=TOKEN&api_key=" + b"x" * MAX_FORM_BYTES, FORM, 413, "at most"),
    (b"csrf=TOKEN&api_key=", FORM, 400, "Enter an API key"),
    (b"csrf=TOKEN&api_key=" + b"k" * 600, FORM, 400, "at most 512 characters"),
    (b"csrf=TOKEN&api_key=\xff\xfe%FF", FORM, 401, "Invalid API key"),
])
async def test_bad_sign_in_forms_get_a_clear_page(dashboard_server, body, content_type, status, words):
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        token = await signed_out_session(client)
        response = await client.post("/dashboard/login", content=body.replace(b"TOKEN", token.encode()),
                                     headers={"content-type": content_type})
        assert response.status_code == status, response.text[:500]
        assert words in response.text
        assert (await client.get("/dashboard/overview", follow_redirects=False)).status_code == 302  # not signed in


async def test_a_form_without_any_session_is_refused(dashboard_server):
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        for path in ("/dashboard/login", "/dashboard/logout"):
            response = await client.post(path, data={"csrf": "x", "api_key": "y"})
            assert response.status_code == 403 and "reload the page" in response.text


async def test_the_admins_keys_page_refuses_an_unknown_team_or_cursor(dashboard_server):
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        token = await signed_out_session(client)
        signed = await client.post("/dashboard/login", data={"csrf": token, "api_key": ADMIN_KEY})
        assert signed.status_code == 303
        for query, status, words in (("keys_of=team_nope", 404, "No such team"), ("cursor=%%%", 400, "cursor"),
                                     ("cursor=" + "A" * 2000, 400, "cursor")):
            response = await client.get(f"/dashboard/keys?{query}")
            assert response.status_code == status and words in response.text, (query, response.text[:300])
        csrf = re.search(r'name="csrf" value="([^"]+)"', (await client.get("/dashboard/keys")).text).group(1)
        created = await client.post("/dashboard/keys/create", data={"csrf": csrf, "name": "x", "team_id": "team_nope"})
        assert created.status_code == 404 and "No such team" in created.text
