"""Sign-in through an identity provider (OpenID Connect, code flow with PKCE) against a provider the test starts
(tests/gateway/dashboard/oidc_provider.py, a real RSA key): Chromium clicks through it into the account; a forged
signature, another nonce, another state, a foreign browser, an unverified or unknown address each sign nobody in;
the ID token checks one by one (auth/id_tokens.py)."""

from __future__ import annotations

import time

import httpx
import msgspec
import pytest

from auth.id_tokens import IdTokenRefused, verify
from gateway.config import OidcSettings
from testkit.smtp import smtp_server
from tests.gateway.dashboard.accounts_kit import mailing_settings, owner_account
from tests.gateway.dashboard.browser import chromium_page
from tests.gateway.dashboard.oidc_provider import CLIENT_ID, CLIENT_SECRET, jwk, new_key, oidc_provider, sign_jwt
from tests.gateway.dashboard.served import served_gateway
from tests.gateway.dashboard.test_dashboard_accessibility import violations


@pytest.fixture
async def signed(tmp_path):
    """(gateway, provider) with `[oidc]` pointed at the provider, which vouches for olga@example.com."""
    with smtp_server() as mail, oidc_provider("olga@example.com") as provider:
        settings = msgspec.structs.replace(mailing_settings(tmp_path, mail), oidc=OidcSettings(
            issuer=provider.issuer, client_id=CLIENT_ID, client_secret=CLIENT_SECRET, allow_http=True,
            label="Test IdP"))
        async with served_gateway(settings) as served:
            team, _ = await owner_account(served, "Acme", "olga@example.com")
            yield served, provider, team


@pytest.mark.slow
async def test_a_person_signs_in_through_the_provider_in_chromium(signed):
    served, _, team = signed
    async with chromium_page() as page:
        await page.goto(f"{served.url}/dashboard/login")
        assert await violations(page) == []
        await page.click("#oidc-sign-in")
        await page.wait_for_url("**/dashboard/overview**")
        assert "Acme (owner)" in await page.text_content("#team-switch")
        await page.click("nav >> text=Account")
        assert await page.locator("tr[data-session]").count() == 1


async def _attempt(served) -> httpx.Response:
    async with httpx.AsyncClient(base_url=served.url, timeout=30, follow_redirects=True) as client:
        return await client.get("/dashboard/oidc/start")


async def test_a_misbehaving_provider_signs_nobody_in(signed):
    served, provider, _ = signed
    provider.signing_key = new_key()  # a forged signature under the provider's kid
    answer = await _attempt(served)
    assert answer.status_code == 400 and "signature" in answer.text
    provider.signing_key, provider.nonce = None, "another sign-in's nonce"
    answer = await _attempt(served)
    assert answer.status_code == 400 and "nonce" in answer.text
    provider.nonce, provider.email_verified = None, False
    answer = await _attempt(served)
    assert answer.status_code == 400 and "vouches for no e-mail" in answer.text
    provider.email_verified, provider.email = True, "stranger@example.com"
    answer = await _attempt(served)
    assert answer.status_code == 403 and "invitation" in answer.text
    provider.email = "olga@example.com"
    answer = await _attempt(served)
    assert answer.status_code == 200 and str(answer.url).startswith(f"{served.url}/dashboard/overview")


async def test_a_callback_this_browser_did_not_start_is_refused(signed):
    served, _, _ = signed
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as victim, \
            httpx.AsyncClient(base_url=served.url, timeout=30) as attacker:
        authorize = (await attacker.get("/dashboard/oidc/start")).headers["location"]
        callback = (await attacker.get(authorize)).headers["location"]  # the attacker's own code and state
        answer = await victim.get(callback)  # login CSRF: planted in the victim's browser
        assert answer.status_code == 400 and "did not start" in answer.text
        await victim.get("/dashboard/oidc/start")  # the victim's own attempt has its own state
        answer = await victim.get(callback)
        assert answer.status_code == 400 and "state" in answer.text
        assert (await victim.get("/dashboard/overview")).status_code == 302  # signed in as nobody


async def test_without_a_provider_there_is_no_such_sign_in(dashboard_server):
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
        assert (await client.get("/dashboard/oidc/start")).status_code == 404
        assert "oidc-sign-in" not in (await client.get("/dashboard/login")).text


KEY = new_key()
JWKS = {"keys": [jwk(KEY)]}
ISSUER = "https://idp.example.com"


MINTED = int(time.time())  # the tokens below are made at collection; each check reads them at this moment


def _claims(**changes) -> dict:
    return {"iss": ISSUER, "aud": CLIENT_ID, "exp": MINTED + 60, "iat": MINTED, "nonce": "n", **changes}


@pytest.mark.parametrize(("token", "why"), [
    (sign_jwt(KEY, _claims(iss="https://other.example.com")), "issuer"),
    (sign_jwt(KEY, _claims(aud="someone-else")), "client"),
    (sign_jwt(KEY, _claims(aud=[CLIENT_ID, "x"], azp="x")), "client"),
    (sign_jwt(KEY, _claims(exp=MINTED - 3600)), "expired"),
    (sign_jwt(KEY, _claims(iat=MINTED + 3600)), "future"),
    (sign_jwt(KEY, _claims(nonce="m")), "nonce"),
    (sign_jwt(KEY, _claims(), kid="unknown"), "kid"),
    (sign_jwt(KEY, _claims(), alg="HS256"), "RS256"),
    (sign_jwt(KEY, _claims()).rsplit(".", 1)[0] + ".", "signature"),
    ("eyJhbGciOiJub25lIn0.e30.", "RS256"),
    ("not a token", "compact"),
])
def test_each_id_token_check_refuses(token, why):
    with pytest.raises(IdTokenRefused, match=why):
        verify(token, JWKS, issuer=ISSUER, client_id=CLIENT_ID, nonce="n", now=MINTED)


def test_a_good_id_token_passes():
    assert verify(sign_jwt(KEY, _claims(sub="u")), JWKS, issuer=ISSUER, client_id=CLIENT_ID, nonce="n",
                  now=MINTED)["sub"] == "u"
