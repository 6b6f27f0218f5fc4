"""One e-mail through the operator's SMTP relay (Settings' `[budget_alerts]`): the budget and health alerts and the
accounts' links all go this way, each with the Date and Message-ID headers mail servers expect."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

from gateway.config import BudgetAlertSettings


def send_mail(relay: BudgetAlertSettings, to: str, subject: str, text: str) -> None:
    """Blocking (smtplib): call it off the event loop."""
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = relay.smtp_from, to, subject
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = make_msgid(domain=relay.smtp_from.rpartition("@")[2] or "localhost")
    message.set_content(text)
    with smtplib.SMTP(relay.smtp_host, relay.smtp_port, timeout=relay.timeout_s) as smtp:
        if relay.smtp_starttls:
            smtp.starttls()
        if relay.smtp_username:
            smtp.login(relay.smtp_username, relay.smtp_password)
        smtp.send_message(message)
