"""The weekly report delivered: the admin page as PDF, and e-mail to admins and to each team.

PDF: the admin page printed by headless Chromium (Debian's /usr/bin/chromium, or Playwright's own), a real
engine, so charts and tables look as in a browser. Where neither is installed the report goes without a PDF and
the log says so. E-mail: `[report.email]` in the config; admins get the admin page (as the message body and
attached), its PDF and the summary CSV; each team's recipients get their team's page and CSV only.
"""
from __future__ import annotations

import logging
from email.message import EmailMessage
from pathlib import Path

from gpuledger.analytics.config import EmailConfig
from gpuledger.analytics.report import ReportFiles
from gpuledger.collector.errors import GpuledgerError
from gpuledger.deploy.mail import MailError, send_mail

log = logging.getLogger(__name__)
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


class DeliveryError(GpuledgerError):
    """The report could not be mailed (SMTP refused, credentials missing)."""


class PdfUnavailable(GpuledgerError):
    """A PDF was asked for on a command line and cannot be printed here: the install lacks the [pdf] extra or no
    Chromium runs (an error, never a warning with exit 0: a cron job asking for a PDF must see it fail)."""


PDF_EXTRA = ("PDF printing needs the [pdf] extra (pip install 'gpuledger[pdf]') and a Chromium: Debian's chromium "
             "package, or `playwright install chromium`")


def render_pdf(files: ReportFiles, strict: bool = False) -> Path | None:
    """The admin page as PDF beside it; None (with a warning) when no Chromium is at hand, or PdfUnavailable with
    `strict` (a user asked for it)."""
    files.pdf = print_pdf(files.html, strict)
    return files.pdf


def print_pdf(page: Path, strict: bool = False) -> Path | None:
    """An HTML page printed to PDF beside it (A4) by headless Chromium; without one, None with a warning (the
    scheduled report goes out without its PDF), or PdfUnavailable naming what to install with `strict`."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        if strict:
            raise PdfUnavailable(f"{PDF_EXTRA}; playwright is not installed") from None
        log.warning("no PDF: playwright is not installed (%s)", PDF_EXTRA)
        return None
    target = page.with_suffix(".pdf")
    try:
        with sync_playwright() as p:
            options = {"executable_path": CHROMIUM} if Path(CHROMIUM).exists() else {}
            browser = p.chromium.launch(args=CHROMIUM_FLAGS, **options)
            tab = browser.new_page()
            tab.goto(page.resolve().as_uri())
            tab.pdf(path=str(target), format="A4", print_background=True,
                    margin={"top": "1cm", "bottom": "1cm", "left": "1cm", "right": "1cm"})
            browser.close()
    except Error as exc:
        if strict:
            raise PdfUnavailable(f"no PDF of {page}: {str(exc).splitlines()[0]} ({PDF_EXTRA})") from exc
        log.warning("no PDF of %s: %s", page, exc)
        return None
    return target


def _attach(message: EmailMessage, path: Path) -> None:
    kinds = {".html": ("text", "html"), ".csv": ("text", "csv"), ".pdf": ("application", "pdf")}
    main, sub = kinds[path.suffix]
    message.add_attachment(path.read_bytes(), maintype=main, subtype=sub, filename=path.name)


def messages(email: EmailConfig, files: ReportFiles) -> list[EmailMessage]:
    """The messages to send: one to the admins, one per team that has recipients and a page this week."""
    out = []

    def message(to: tuple[str, ...], subject: str, page: Path, attachments: list[Path]) -> EmailMessage:
        msg = EmailMessage()
        msg["From"], msg["To"], msg["Subject"] = email.sender, ", ".join(to), subject
        msg.set_content(f"The gpuledger report for week {files.label} is attached ({page.name}).")
        msg.add_alternative(page.read_text(encoding="utf-8"), subtype="html")
        for path in attachments:
            _attach(msg, path)
        return msg
    if email.admins:
        out.append(message(email.admins, f"GPU cost report, week {files.label}", files.html,
                           [files.html, files.summary_csv] + ([files.pdf] if files.pdf else [])))
    for team, to in sorted(email.teams.items()):
        page = files.team_pages.get(team)
        if page is None:
            log.info("no report for team %s this week: nothing mailed to it", team)
            continue
        out.append(message(to, f"GPU cost report for {team}, week {files.label}", page,
                           [page] + ([files.team_csvs[team]] if team in files.team_csvs else [])))
    return out


def send(email: EmailConfig, files: ReportFiles, timeout_s: float = 30.0) -> int:
    """Mail the report; returns the messages sent. Raises DeliveryError with the server's reason."""
    outgoing = messages(email, files)
    try:
        send_mail(email, outgoing, timeout_s)
    except MailError as exc:
        raise DeliveryError(str(exc).replace("cannot mail", "cannot mail the report", 1)) from exc
    log.info("weekly report %s mailed: %d message(s)", files.label, len(outgoing))
    return len(outgoing)


def deliver(email: EmailConfig | None, files: ReportFiles) -> int:
    """The scheduled job's delivery: a PDF, then mail when configured; failures are logged, never raised."""
    render_pdf(files)
    if email is None:
        return 0
    try:
        return send(email, files)
    except DeliveryError as exc:
        log.error("%s", exc)
        return 0
