"""What the accounts tests share: the dashboard's gateway with its `[budget_alerts]` SMTP settings pointed at a
real local SMTP server (testkit/smtp.py), the links that arrive there, and an owner with an account."""

from __future__ import annotations

import asyncio
import re

import msgspec

from auth.admin import Actor
from auth.policy import Manager
from gateway.config import BudgetAlertSettings
from tests.gateway.dashboard.served import settings_in

PASSWORD = "correct horse battery"
_LINK = re.compile(r"https?://\S+/dashboard/[a-z/-]+\?token=[A-Za-z0-9_-]+")


def mailing_settings(folder, mail):
    settings = settings_in(folder)
    alerts = BudgetAlertSettings(smtp_host=mail.host, smtp_port=mail.port, smtp_starttls=False, timeout_s=30.0,
                                 smtp_from="sluice@example.com")
    return msgspec.structs.replace(settings, budget_alerts=alerts)


async def link_mailed(mail, to: str, count: int = 1) -> tuple[str, object]:
    """The link in the `count`-th message to `to` (waits for it: mail goes out in the background)."""
    for _ in range(600):
        sent = [d for d in mail.delivered if to in d.recipients]
        if len(sent) >= count:
            message = sent[count - 1].message
            return _LINK.search(message.get_content()).group(0), message
        await asyncio.sleep(0.05)
    raise AssertionError(f"no message {count} to {to} arrived: {[d.recipients for d in mail.delivered]}")


async def owner_account(served, team_name: str, email: str) -> tuple[str, str]:
    """A team and its owner, who has an account (the operator invited them): (team id, user id)."""
    auth = served.app.state.services.auth
    team_id = (await served.admin("POST", "/admin/teams", name=team_name))["id"]
    token = await auth.memberships.invite(Actor("cli:test", "cli"), Manager(None, True, "admin"), team_id, email,
                                          "owner")
    user_id, _ = await auth.memberships.accept(token, team_name + " owner", PASSWORD, "test")
    return team_id, user_id
