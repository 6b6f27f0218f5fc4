"""The dashboard's pages against a hostile browser context (issue #31, item 11), on the real gateway app served
by uvicorn (tests/gateway/dashboard/served.py): every answer forbids framing, runs no inline script under a
Content-Security-Policy and is never stored (the page that shows a new key in clear included); htmx keeps no
copy of a page, so Back after sign-out shows nothing; a number field refuses anything but ASCII digits with a
clear page, never a 500. Chromium (through Playwright, back/forward cache on as in a real browser) reports no
CSP violation on any page while its controls are used."""

from __future__ import annotations

import asyncio
import re
import time
from html.parser import HTMLParser

import httpx
import pytest
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import async_playwright

from gateway.dashboard.fields import MAX_DIGITS
from tests.billing.factory import usage
from tests.gateway.dashboard.browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS
from tests.gateway.dashboard.served import ADMIN_KEY

pytestmark = pytest.mark.slow


async def seed(dashboard_server) -> dict:
    """Acme, owned by alice, with usage to show; her key signs in."""
    acme, alice, key = await dashboard_server.owned_team("Acme", "alice", "alice laptop")
    service = await dashboard_server.admin("POST", "/admin/keys", name="acme batch", team_id=acme)
    await dashboard_server.ledger.record(usage(team_id=acme, key_id=key["id"], user_id=alice, model="small",
                                               time=time.time() - 3600, prompt_tokens=1234))
    await dashboard_server.ledger.flush(10)
    return {"acme": acme, "key": key, "service": service}


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


async def signed_in(client: httpx.AsyncClient, key: str) -> str:
    """Signs `client` in with `key`; the session's CSRF token."""
    token = csrf_of((await client.get("/dashboard/login")).text)
    assert (await client.post("/dashboard/login", data={"csrf": token, "api_key": key})).status_code == 303
    return csrf_of((await client.get("/dashboard/overview")).text)


def assert_guarded(response: httpx.Response) -> None:
    where = f"{response.request.method} {response.request.url.path} -> {response.status_code}"
    policy = response.headers.get("content-security-policy", "")
    directives = dict((d.strip().split(" ", 1) + [""])[:2] for d in policy.split(";") if d.strip())
    assert directives.get("frame-ancestors") == "'none'", (where, policy)
    assert directives.get("script-src") == "'self'" and directives.get("style-src") == "'self'", (where, policy)
    assert directives.get("default-src") == "'none'" and directives.get("form-action") == "'self'", (where, policy)
    assert response.headers.get("x-frame-options") == "DENY", where
    assert response.headers.get("cache-control") == "no-store", where
    assert response.headers.get("x-content-type-options") == "nosniff", where


class InlineCode(HTMLParser):
    """What a CSP without 'unsafe-inline' would refuse: script bodies, on* handlers, style attributes and tags."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._script = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self._script = tag == "script" and "src" not in attrs and attrs.get("type") != "application/json"
        if tag == "style":
            self.found.append("<style>")
        self.found += [f"{tag} {name}=" for name in attrs if name.startswith("on") or name == "style"]

    def handle_data(self, data):
        if self._script and data.strip():
            self.found.append(f"<script>{data[:60]}")

    def handle_endtag(self, tag):
        self._script = False


def inline_code(html: str) -> list[str]:
    parser = InlineCode()
    parser.feed(html)
    return parser.found


async def test_every_dashboard_answer_is_guarded_and_holds_no_inline_code(dashboard_server):
    data = await seed(dashboard_server)
    answers = []
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
        answers.append(await client.get("/dashboard/login"))
        answers.append(await client.get("/dashboard/overview"))  # not signed in: the redirect to sign in
        csrf = await signed_in(client, ADMIN_KEY)
        team = f"team_id={data['acme']}"
        for path in ("/dashboard/", f"/dashboard/overview?{team}", f"/dashboard/overview?{team}&tz=Asia/Kolkata",
                     f"/dashboard/requests?{team}", "/dashboard/teams", f"/dashboard/keys?{team}",
                     f"/dashboard/export.csv?{team}", f"/dashboard/statement.csv?{team}&month=2026-11",
                     "/dashboard/overview?range=forever", "/dashboard/overview?team_id=team_nope"):
            answers.append(await client.get(path))
        created = await client.post(f"/dashboard/keys/create?{team}", data={"csrf": csrf, "name": "ci"})
        rotated = await client.post(f"/dashboard/keys/{data['service']['id']}/rotate?{team}",
                                    data={"csrf": csrf, "grace_seconds": "0", "confirm": "yes"})
        for shown in (created, rotated):  # the pages that show a new key in clear
            assert shown.status_code == 201 and 'id="new-key"' in shown.text, shown.text[:300]
        answers += [created, rotated]
        asked = await client.post(f"/dashboard/keys/{data['key']['id']}/revoke?{team}", data={"csrf": csrf})
        assert asked.status_code == 200 and 'id="confirm-action"' in asked.text  # asks first
        answers.append(asked)
        answers.append(await client.post(f"/dashboard/keys/{data['key']['id']}/revoke?{team}",
                                         data={"csrf": csrf, "confirm": "yes"}))
        answers.append(await client.post("/dashboard/logout", data={"csrf": csrf}))
    statuses = sorted({a.status_code for a in answers})
    assert statuses == [200, 201, 302, 303, 400, 404], statuses  # pages, redirects and error pages alike
    for answer in answers:
        assert_guarded(answer)
        if answer.headers.get("content-type", "").startswith("text/html"):
            assert inline_code(answer.text) == [], (answer.request.url.path, inline_code(answer.text))


@pytest.mark.parametrize("grace", ["²", "٣", "３", "1e3", "-1", "0x10", "1" * (MAX_DIGITS + 1), "9" * 5000])
async def test_a_number_field_takes_ascii_digits_only(dashboard_server, grace):
    data = await seed(dashboard_server)
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
        csrf = await signed_in(client, data["key"]["key"])
        path = f"/dashboard/keys/{data['service']['id']}/rotate?team_id={data['acme']}"
        refused = await client.post(path, data={"csrf": csrf, "grace_seconds": grace})
        assert refused.status_code == 400, refused.text[:500]
        assert "grace_seconds" in refused.text and "digits 0-9" in refused.text
        assert_guarded(refused)
        keys = await client.get(f"/dashboard/keys?team_id={data['acme']}")
        row = re.search(rf'data-key-id="{data["service"]["id"]}".*?data-status[^>]*>([^<]+)<', keys.text, re.S)
        assert row.group(1) == "active"  # not rotated
        rotated = await client.post(path, data={"csrf": csrf, "grace_seconds": " 60 ", "confirm": "yes"})
        assert rotated.status_code == 201 and 'id="new-key"' in rotated.text


@pytest.mark.parametrize("month", ["٢٠٢٦-١١", "２０２６-１１", "2026-1²"])
async def test_the_statement_month_takes_ascii_digits_only(dashboard_server, month):
    data = await seed(dashboard_server)
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
        await signed_in(client, data["key"]["key"])
        refused = await client.get("/dashboard/statement.csv", params={"team_id": data["acme"], "month": month})
        assert refused.status_code == 400 and "month must look like" in refused.text, refused.text[:300]


VIOLATIONS = """document.addEventListener("securitypolicyviolation",
    (e) => window.cspViolation(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`));"""


async def back(page) -> str:
    """Back one page; the page's HTML once it settled (a page the gateway answers with the sign-in form redirects,
    and htmx reloads a page it kept no copy of)."""
    try:
        await page.go_back(wait_until="load")
    except PlaywrightError as error:  # the answer to a form was not kept: the browser would have to post it again
        assert "ERR_CACHE_MISS" in str(error), error
    for _ in range(50):
        try:
            await page.wait_for_load_state("load")
            return await page.content()
        except PlaywrightError as error:  # still navigating
            assert "navigating" in str(error), error
            await asyncio.sleep(0.2)
    raise AssertionError(f"{page.url} never settled")


async def test_chromium_back_after_sign_out_shows_nothing_and_no_page_breaks_the_policy(dashboard_server):
    data = await seed(dashboard_server)
    violations: list[str] = []
    async with async_playwright() as playwright:
        # Playwright turns the back/forward cache off by default; a user's browser has it on
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=WAIT_MS,
                                                   ignore_default_args=["--disable-back-forward-cache"])
        context = await browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id="Asia/Kolkata")
        context.set_default_timeout(WAIT_MS)
        await context.expose_function("cspViolation", lambda line: violations.append(line))
        await context.add_init_script(VIOLATIONS)
        page = await context.new_page()
        policies = []
        page.on("response", lambda r: policies.append(r.headers.get("content-security-policy"))
                if r.request.resource_type == "document" else None)
        try:
            await page.goto(f"{dashboard_server.url}/dashboard/login")
            await page.fill("#api_key", data["key"]["key"])
            await page.click("button[type=submit]")
            await page.wait_for_url("**/dashboard/overview")
            assert "1,234" in await page.inner_text("[data-tile=prompt_tokens]")
            await page.wait_for_selector("[data-chart=tokens] canvas")  # uPlot drew under the policy
            # the filter form through htmx (a pushed URL), then the zone toggle, both handled by dashboard.js
            await page.select_option("#range", "30d")
            await page.click("#apply")
            await page.wait_for_url("**range=30d**")
            assert await page.evaluate("localStorage.getItem('htmx-history-cache')") is None
            await page.click("#local-time")
            await page.wait_for_url("**tz=Asia%2F*")  # the zone of the context (ICU may say Calcutta)
            await page.wait_for_selector("#utc-time")
            await page.wait_for_selector("[data-chart=tokens] canvas")  # drawn again in what htmx swapped in
            await page.click("#utc-time")
            await page.wait_for_url("**tz=UTC**")
            await page.click("text=Requests")
            await page.wait_for_url("**/dashboard/requests**")
            await page.click("text=Keys")
            await page.wait_for_url("**/dashboard/keys**")
            await page.fill("#key-name", "shown once")
            await page.click("#create-key")
            secret = (await page.inner_text("#new-key")).strip()
            assert secret.startswith("sk-")
            await page.click("#sign-out")
            await page.wait_for_url("**/dashboard/login")
            assert await page.evaluate("localStorage.getItem('htmx-history-cache')") is None
            # Back, through every page of the session: none shows its data again
            for _ in range(6):
                shown = await back(page)
                assert secret not in shown and "1,234" not in shown and "alice laptop" not in shown, page.url
                assert await page.query_selector("[data-tile]") is None, page.url
            # the team switcher works without an inline handler (signed in again, as the admin)
            await page.goto(f"{dashboard_server.url}/dashboard/login")
            await page.fill("#api_key", ADMIN_KEY)
            await page.click("button[type=submit]")
            await page.wait_for_url("**/dashboard/teams")  # the operator lands on the ranking
            await page.select_option("#team-switch", data["acme"])
            await page.wait_for_url(f"**team_id={data['acme']}**")
            await page.goto(f"{dashboard_server.url}/dashboard/keys")
            await page.select_option("#keys-of", data["acme"])
            await page.wait_for_url(f"**keys_of={data['acme']}**")
            await page.click("text=All teams")
            await page.wait_for_url("**/dashboard/teams**")
        finally:
            await context.close()
            await browser.close()
    assert violations == []
    assert policies and all(policy and "frame-ancestors 'none'" in policy for policy in policies), policies
