"""The accounts' and members' forms from a plain HTTP client, where a browser would not go: another team's
members and invitations, another user's sessions, a member posting an owner's form, bad addresses, the last
owner, the throttle, links that a GET leaves unused, and links that never follow the request's Host header."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from testkit.smtp import smtp_server
from tests.gateway.dashboard.accounts_kit import PASSWORD, link_mailed, mailing_settings, owner_account
from tests.gateway.dashboard.served import ADMIN_KEY, served_gateway

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
def mail():
    with smtp_server() as server:
        yield server


@pytest.fixture
async def served(tmp_path, mail):
    async with served_gateway(mailing_settings(tmp_path, mail)) as gateway:
        yield gateway


async def _csrf(client: httpx.AsyncClient, path: str = "/dashboard/login") -> str:
    return CSRF.search((await client.get(path)).text).group(1)


@contextlib.asynccontextmanager
async def _signed_in(served, email: str, password: str = PASSWORD) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        answer = await client.post("/dashboard/sign-in", data={"csrf": await _csrf(client), "email": email,
                                                               "password": password})
        assert answer.status_code == 303, answer.text
        yield client


async def test_an_owner_reaches_no_other_team(served, mail):
    a, _ = await owner_account(served, "A", "ann@example.com")
    b, bob = await owner_account(served, "B", "bob@example.com")
    async with _signed_in(served, "ann@example.com") as ann:
        token = await _csrf(ann, f"/dashboard/members?team_id={a}")
        invite = {"csrf": token, "email": "eve@example.com", "role": "member"}
        assert (await ann.post(f"/dashboard/members/invite?team_id={b}", data=invite)).status_code == 404
        for action in ("role", "remove"):  # B's owner named in team A's form
            answer = await ann.post(f"/dashboard/members/{action}?team_id={a}",
                                    data={"csrf": token, "user_id": bob, "role": "member"})
            assert answer.status_code == 404 and "No such member" in answer.text
        assert await served.app.state.services.auth.store.get_role(b, bob) == "owner"
        bad = await ann.post(f"/dashboard/members/invite?team_id={a}", data={**invite, "email": "x" * 300 + "@e.com"})
        assert bad.status_code == 400 and "at most 254" in bad.text
        bad = await ann.post(f"/dashboard/members/invite?team_id={a}", data={**invite, "role": "admin"})
        assert bad.status_code == 400 and "role must be" in bad.text
        last = await ann.post(f"/dashboard/members/role?team_id={a}",
                              data={"csrf": token, "user_id": (await _members(served, a))[0], "role": "member"})
        assert last.status_code == 409 and "at least one owner" in last.text
        # Ann joins B as a member: B's page is hers to see, not to run
        auth = served.app.state.services.auth
        await served.admin("PUT", f"/admin/teams/{b}/members/{(await _members(served, a))[0]}", role="member")
        assert (await ann.post(f"/dashboard/members/invite?team_id={b}", data=invite)).status_code == 403
        assert len(await auth.memberships.pending(b)) == 0
    assert mail.delivered == []


async def _members(served, team_id: str) -> list[str]:
    return [m.user_id for m in await served.app.state.services.auth.store.list_members(team_id)]


async def test_sessions_are_each_users_own(served):
    await owner_account(served, "A", "ann@example.com")
    await owner_account(served, "B", "bob@example.com")
    async with _signed_in(served, "ann@example.com") as ann, \
            _signed_in(served, "bob@example.com") as bob:
        bobs = re.search(r'data-session="([0-9a-f]{64})"', (await bob.get("/dashboard/account")).text).group(1)
        answer = await ann.post("/dashboard/account/sessions/end",
                                data={"csrf": await _csrf(ann, "/dashboard/account"), "session": bobs})
        assert answer.status_code == 404
        assert (await bob.get("/dashboard/account")).status_code == 200  # still signed in
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as key_holder:
        await key_holder.post("/dashboard/login", data={"csrf": await _csrf(key_holder), "api_key": ADMIN_KEY})
        answer = await key_holder.get("/dashboard/account")
        assert answer.status_code == 404 and "API key" in answer.text


async def test_the_sign_in_form_throttles_and_refuses_bad_input(served):
    await owner_account(served, "A", "ann@example.com")
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        token = await _csrf(client)
        for email, status in (("", 400), ("not an address", 400), ("ann@example.com", 401)):
            answer = await client.post("/dashboard/sign-in", data={"csrf": token, "email": email, "password": "p"})
            assert answer.status_code == status
        missing = await client.post("/dashboard/sign-in", data={"csrf": token, "email": "ann@example.com"})
        assert missing.status_code == 400 and "Enter your password" in missing.text
        for _ in range(4):  # five wrong in all
            await client.post("/dashboard/sign-in", data={"csrf": token, "email": "ann@example.com", "password": "p"})
        throttled = await client.post("/dashboard/sign-in", data={"csrf": token, "email": "ann@example.com",
                                                                  "password": PASSWORD})
        assert throttled.status_code == 429 and "Too many failed sign-ins" in throttled.text
        forged = await client.post("/dashboard/sign-in", data={"csrf": "forged", "email": "a@b.co", "password": "p"})
        assert forged.status_code == 403


async def test_a_link_survives_a_get_follows_public_url_and_never_the_host_header(served, mail):
    await owner_account(served, "A", "ann@example.com")
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        token = await _csrf(client)
        asked = await client.post("/dashboard/sign-in/email-link", data={"csrf": token, "email": "ann@example.com"},
                                  headers={"host": "evil.example", "x-forwarded-host": "evil.example"})
        unknown = await client.post("/dashboard/sign-in/email-link", data={"csrf": token, "email": "no@example.com"})
        assert asked.status_code == unknown.status_code == 200  # the same answer: no one learns who has an account
        assert (re.sub(r'value="[^"]*"', "", asked.text) == re.sub(r'value="[^"]*"', "", unknown.text)
                and "on its way" in asked.text)
        link, _ = await link_mailed(mail, "ann@example.com")
        assert link.startswith(f"{served.url}/dashboard/sign-in/link?token=")
        for _ in range(2):  # a mail scanner's GETs use nothing
            assert (await client.get(link)).status_code == 200
        used = await client.post("/dashboard/sign-in/link", data={"csrf": token, "token": link.split("token=")[1]},
                                 follow_redirects=False)
        assert used.status_code == 303
        assert (await client.get(link)).status_code == 400
        assert (await client.get("/dashboard/sign-in/link?token=" + "x" * 5000)).status_code == 400
        assert (await client.get("/dashboard/invite?token=nope")).status_code == 400
        assert (await client.get("/dashboard/reset")).status_code == 400
    assert [d.recipients for d in mail.delivered] == [["ann@example.com"]]


async def test_an_invitation_bounds_its_name_and_keeps_its_link(served, mail):
    a, _ = await owner_account(served, "A", "ann@example.com")
    async with _signed_in(served, "ann@example.com") as ann:
        token = await _csrf(ann, f"/dashboard/members?team_id={a}")
        sent = await ann.post(f"/dashboard/members/invite?team_id={a}",
                              data={"csrf": token, "email": "cy@example.com", "role": "member"})
        assert sent.status_code == 303
    link, _ = await link_mailed(mail, "cy@example.com")
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as cy:
        token = await _csrf(cy, link.removeprefix(served.url))
        invite = {"csrf": token, "token": link.split("token=")[1], "password": PASSWORD, "confirm": PASSWORD}
        long_name = await cy.post("/dashboard/invite", data={**invite, "name": "n" * 201})
        assert long_name.status_code == 400 and "at most 200" in long_name.text
        differ = await cy.post("/dashboard/invite", data={**invite, "name": "Cy", "confirm": "something else"})
        assert differ.status_code == 400 and "differ" in differ.text
        joined = await cy.post("/dashboard/invite", data={**invite, "name": "Cy"}, follow_redirects=False)
        assert joined.status_code == 303 and joined.headers["location"] == f"/dashboard/overview?team_id={a}"
