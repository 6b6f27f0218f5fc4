"""Accounts in Chromium, as people click through them: an owner signs in with e-mail and password and invites a
member; the invitation arrives at a real local SMTP server; the member follows the link, sets a password, lands
in the team, signs out and in again with the password; signs in with a one-time e-mail link; resets a forgotten
password; lists their sessions and signs out everywhere; the owner promotes and removes them. axe-core on every
new page (tests/gateway/dashboard/test_dashboard_accessibility.py's check)."""

from __future__ import annotations

import pytest

from testkit.smtp import smtp_server
from tests.gateway.dashboard.accounts_kit import PASSWORD, link_mailed, mailing_settings, owner_account
from tests.gateway.dashboard.browser import chromium_page
from tests.gateway.dashboard.served import served_gateway
from tests.gateway.dashboard.test_dashboard_accessibility import violations

pytestmark = pytest.mark.slow
NEW_PASSWORD = "a much better password"


async def _password_sign_in(page, url: str, email: str, password: str) -> None:
    await page.goto(f"{url}/dashboard/login")
    await page.fill("#email", email)
    await page.fill("#password", password)
    await page.click("#password-sign-in")


async def test_invite_join_sign_in_link_reset_and_sign_out_everywhere(tmp_path):
    found: list[str] = []
    with smtp_server() as mail:
        async with served_gateway(mailing_settings(tmp_path, mail)) as served, \
                chromium_page() as owner, chromium_page() as member:
            url = served.url
            team, _ = await owner_account(served, "Acme", "olga@example.com")
            await owner.goto(f"{url}/dashboard/login")
            found += await violations(owner)
            await _password_sign_in(owner, url, "olga@example.com", PASSWORD)
            await owner.wait_for_url("**/dashboard/overview**")
            await owner.click("nav >> text=Members")
            await owner.fill("#invite-email", "Mia@Example.com")
            await owner.select_option("#invite-role", "member")
            await owner.click("#send-invite")
            assert await owner.text_content("#members-done") == "Invitation sent."
            assert await owner.locator("tr[data-invite='mia@example.com']").count() == 1
            found += await violations(owner)

            invite, message = await link_mailed(mail, "mia@example.com")
            assert "Acme" in message["Subject"] and message["Date"] and message["Message-ID"]
            assert invite.startswith(f"{url}/dashboard/invite?token=")
            await member.goto(invite)
            assert await member.text_content("#invite-email") == "mia@example.com"
            found += await violations(member)
            await member.fill("#name", "Mia")
            await member.fill("#password", "too short")
            await member.fill("#confirm", "too short")
            await member.evaluate("document.querySelectorAll('[minlength]').forEach(e => e.minLength = 0)")
            await member.click("#accept")  # the server's rule, said on the page; the link still works
            assert "at least 10" in await member.text_content("#invite-message")
            await member.fill("#password", PASSWORD)
            await member.fill("#confirm", PASSWORD)
            await member.click("#accept")
            await member.wait_for_url(f"**/dashboard/overview?team_id={team}")
            assert "Acme (member)" in await member.text_content("#team-switch")
            await member.click("#sign-out")
            await member.wait_for_url("**/dashboard/login")
            await member.goto(invite)  # once only
            assert "expired or was already used" in await member.text_content("#invite-message")

            await _password_sign_in(member, url, "mia@example.com", "not my password")
            assert "do not match" in await member.text_content("#login-message")
            await _password_sign_in(member, url, "mia@example.com", PASSWORD)
            await member.wait_for_url("**/dashboard/overview**")
            assert "Acme (member)" in await member.text_content("#team-switch")

            # a one-time link, from another browser of the member's (the owner's window, signed out)
            await owner.click("#sign-out")
            await owner.fill("#link-email", "mia@example.com")
            await owner.click("#send-link")
            assert "on its way" in await owner.text_content("#login-message")
            sign_in_link, _ = await link_mailed(mail, "mia@example.com", 2)
            await owner.goto(sign_in_link)
            found += await violations(owner)
            await owner.click("#use-link")
            await owner.wait_for_url("**/dashboard/overview**")
            await owner.click("nav >> text=Account")
            assert await owner.locator("tr[data-session]").count() == 2
            found += await violations(owner)
            await owner.click("#sign-out-everywhere")
            await owner.wait_for_url("**/dashboard/login")
            await member.goto(f"{url}/dashboard/overview")
            await member.wait_for_url("**/dashboard/login**")  # the other browser is signed out too

            # a forgotten password
            await member.click("text=Forgot your password?")
            found += await violations(member)
            await member.fill("#email", "mia@example.com")
            await member.click("#send-reset")
            assert "on its way" in await member.text_content("#forgot-message")
            reset, _ = await link_mailed(mail, "mia@example.com", 3)
            await member.goto(reset)
            found += await violations(member)
            await member.fill("#password", NEW_PASSWORD)
            await member.fill("#confirm", NEW_PASSWORD)
            await member.click("#set-password")
            await member.wait_for_url("**/dashboard/overview**")
            await member.click("#sign-out")
            await _password_sign_in(member, url, "mia@example.com", PASSWORD)
            assert "do not match" in await member.text_content("#login-message")

            # the owner makes the member an owner, then removes them
            await _password_sign_in(owner, url, "olga@example.com", PASSWORD)
            await owner.wait_for_url("**/dashboard/overview**")
            await owner.goto(f"{url}/dashboard/members?team_id={team}")
            await owner.click("button[aria-label='Make Mia an owner']")
            assert await owner.text_content("#members-done") == "Role changed."
            await owner.click("button[aria-label='Remove Mia']")
            assert await owner.text_content("#members-done") == "Member removed."
            assert await owner.locator("tr[data-user-id]").count() == 1
            found += await violations(owner)
    assert found == [], "\n".join(found)
