"""Sends a spend budget's alert to its webhook and its e-mail addresses (Settings' `[budget_alerts]`).

Beside the request path, never on it: `gateway/serving/budget_gate.py` starts a task per alert, when a
settlement carries the spend across a threshold. Each destination
gets at most `attempts` tries with a doubling pause, each bounded by `timeout_s`; a failure is logged and
dropped (the threshold is already recorded as sent, so a fleet never sends it twice). The webhook body is JSON
signed with HMAC-SHA256 under `webhook_secret`: header `x-sluice-signature: sha256=<hex of the body's MAC>`.
Each call goes only where gateway/serving/outbound.py allows, to the address it checked: a refused destination
is logged (`budget_alert_refused`) and not retried.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac

import httpx
import msgspec
import structlog

from gateway.config import BudgetAlertSettings
from gateway.serving.mail import send_mail
from gateway.serving.outbound import OutboundRefused, OutboundRule, pinned, resolve_webhook

log = structlog.get_logger("gateway.budget_alerts")
SIGNATURE_HEADER = "x-sluice-signature"
FIRST_PAUSE_S = 0.5
SEND_MARGIN_S = 5.0
ADJECTIVE = {"month": "monthly", "day": "daily"}


class Alert(msgspec.Struct, frozen=True):
    """What a webhook receives (JSON) and an e-mail says."""

    scope: str  # "team:<id>" or "key:<id>"
    period: str  # "month" or "day"
    period_key: str  # "2026-11" or "2026-11-26"
    resets_at: str  # ISO 8601 UTC: the period's end
    threshold: int  # percent
    amount_micros: int
    spent_micros: int
    hard: bool  # a hard budget refuses requests at 100 %
    at: str  # ISO 8601 UTC

    @property
    def subject(self) -> str:
        return f"Sluice budget: {self.scope} reached {self.threshold}% of its {ADJECTIVE[self.period]} budget"

    def text(self) -> str:
        money = f"{self.spent_micros / 1e6:.2f} of {self.amount_micros / 1e6:.2f}"
        refusal = " New requests are refused until then." if self.hard and self.threshold >= 100 else ""
        return (f"{self.scope} has spent {money} ({self.threshold}% threshold) in {self.period_key}. "
                f"The budget resets at {self.resets_at}.{refusal}\n")


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class AlertSender:
    def __init__(self, settings: BudgetAlertSettings) -> None:
        self.settings = settings
        self.rule = OutboundRule.of(settings)
        self._client = httpx.AsyncClient(timeout=settings.timeout_s, follow_redirects=False)

    @property
    def longest_s(self) -> float:
        """How long one `send` may take: every attempt's timeout and the pauses between them (the channels go
        together), and a margin for the claim and the name lookup: what a close waits for the alerts under way."""
        attempts = self.settings.attempts
        return attempts * self.settings.timeout_s + FIRST_PAUSE_S * (2 ** (attempts - 1) - 1) + SEND_MARGIN_S

    async def send(self, alert: Alert, webhook_url: str | None, emails: list[str]) -> None:
        jobs = []
        if webhook_url is not None:
            jobs.append(self._retried("webhook", lambda: self._post(alert, webhook_url)))
        if emails:
            if self.settings.smtp_host:
                jobs.append(self._retried("email", lambda: asyncio.to_thread(self._mail, alert, emails)))
            else:
                log.warning("budget_alert_email_skipped", scope=alert.scope, reason="no smtp_host configured")
        await asyncio.gather(*jobs)

    async def _retried(self, channel: str, attempt) -> None:
        pause = FIRST_PAUSE_S
        for number in range(1, self.settings.attempts + 1):
            try:
                await attempt()
                return
            except OutboundRefused as refusal:  # the destination, not the moment: trying again changes nothing
                log.warning("budget_alert_refused", channel=channel, reason=str(refusal))
                return
            except Exception as exc:  # noqa: BLE001 - any failure of the destination is retried, then dropped
                log.warning("budget_alert_failed", channel=channel, attempt=number,
                            error=f"{type(exc).__name__}: {exc}")
            if number < self.settings.attempts:
                await asyncio.sleep(pause)
                pause *= 2

    async def _post(self, alert: Alert, url: str) -> None:
        target, headers, extensions = pinned(*await resolve_webhook(url, self.rule))
        body = msgspec.json.encode(alert)
        headers.update({"content-type": "application/json", "user-agent": "sluice-budget-alerts"})
        if self.settings.webhook_secret:
            headers[SIGNATURE_HEADER] = sign(self.settings.webhook_secret, body)
        response = await self._client.post(target, content=body, headers=headers, extensions=extensions)
        if response.status_code >= 300:
            raise RuntimeError(f"webhook answered {response.status_code}")

    def _mail(self, alert: Alert, emails: list[str]) -> None:
        send_mail(self.settings, ", ".join(emails), alert.subject, alert.text())

    async def close(self) -> None:
        await self._client.aclose()
