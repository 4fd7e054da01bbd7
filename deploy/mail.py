"""One SMTP sender for everything gpuledger mails (the weekly report, alerts): the same server, the same STARTTLS and
the same login from `[report.email]`'s credentials, so a server that requires AUTH takes both or neither.

Why one: alert mail had its own copy without the login, and every alert mail failed with 530 on a server the
weekly report reached fine.
"""
from __future__ import annotations

import os
import smtplib
from email.message import EmailMessage
from typing import Iterable

from gpuledger.analytics.config import EmailConfig
from gpuledger.collector.errors import GpuledgerError


class MailError(GpuledgerError):
    """Mail could not be sent: credentials missing, the server refused or could not be reached."""


def credentials(email: EmailConfig) -> tuple[str | None, str | None]:
    """(user, password) from the variables `[report.email]` names; (None, None) when it names none. MailError when
    it names them and they are not set: sending without the login a server asks for fails later, less clearly."""
    if not email.username_env:
        return None, None
    user = os.environ.get(email.username_env)
    password = os.environ.get(email.password_env) if email.password_env else None
    if not (user and password):
        raise MailError(f"[report.email] credentials: set ${email.username_env} and ${email.password_env}")
    return user, password


def send_mail(email: EmailConfig, messages: Iterable[EmailMessage], timeout_s: float = 30.0) -> int:
    """Send `messages` over one connection to `[report.email]`'s server; the messages sent. MailError with the
    server's reason otherwise."""
    user, password = credentials(email)
    sent = 0
    try:
        with smtplib.SMTP(email.host, email.port, timeout=timeout_s) as smtp:
            if email.starttls:
                smtp.starttls()
            if user:
                smtp.login(user, password or "")
            for message in messages:
                smtp.send_message(message)
                sent += 1
    except (OSError, smtplib.SMTPException) as exc:
        raise MailError(f"cannot mail through {email.host}:{email.port}: {exc}") from exc
    return sent
