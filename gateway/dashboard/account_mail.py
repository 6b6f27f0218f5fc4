"""The e-mails of accounts: a sign-in link, a password reset link, a team invitation. They go through the SMTP
server of Settings' `[budget_alerts]` (the one mail relay the operator configures), each with Date and
Message-ID, in the background: the page answers at once and the same way whether or not an account exists
(the time of the answer tells nothing), and a relay that is down is logged, never shown to whoever asked.

Links point at `public_url` (the address people reach the gateway at), never at the request's Host header,
which whoever asks could set to their own site and so receive the token."""

from __future__ import annotations

import asyncio
import smtplib
from urllib.parse import urlencode

import structlog

from auth.policy import is_owner
from gateway.config import Settings
from gateway.lifecycle import Background
from gateway.serving.mail import send_mail

log = structlog.get_logger("gateway.dashboard.mail")
_sending = Background("account mail")  # held until sent: a task nobody references may be collected


def link(settings: Settings, path: str, token: str) -> str:
    base = settings.public_url.rstrip("/") or f"http://{settings.host}:{settings.port}"
    return f"{base}/dashboard/{path}?{urlencode({'token': token})}"


async def _deliver(settings: Settings, kind: str, to: str, subject: str, text: str) -> None:
    try:
        await asyncio.to_thread(send_mail, settings.budget_alerts, to, subject, text)
    except (OSError, smtplib.SMTPException) as exc:
        log.warning("account_mail_failed", kind=kind, error=type(exc).__name__)  # never the link: it is a secret


def send(settings: Settings, kind: str, to: str, subject: str, text: str) -> None:
    """Mails `text` to `to` in the background (nothing when no SMTP server is configured: logged)."""
    if not settings.budget_alerts.smtp_host:
        log.warning("account_mail_skipped", kind=kind, reason="no smtp_host configured in [budget_alerts]")
        return
    _sending.spawn(_deliver(settings, kind, to, subject, text), name=f"account mail ({kind})")


def sign_in_text(url: str, minutes: int) -> str:
    return (f"Someone (we hope you) asked to sign in to the Sluice dashboard with this address.\n\n"
            f"Sign in: {url}\n\nThe link works once, for {minutes} minutes. If you did not ask, ignore this e-mail.\n")


def reset_text(url: str, minutes: int) -> str:
    return (f"Someone (we hope you) asked to set a new password for the Sluice dashboard.\n\n"
            f"Set a new password: {url}\n\nThe link works once, for {minutes} minutes; setting a password signs "
            "you out everywhere. If you did not ask, ignore this e-mail: your password stays as it is.\n")


def invite_text(url: str, team: str, role: str, days: int) -> str:
    return (f"You are invited to join the team {team!r} on Sluice as {'an owner' if is_owner(role) else 'a member'}."
            f"\n\nAccept: {url}\n\nThe link works once, for {days} days.\n")
