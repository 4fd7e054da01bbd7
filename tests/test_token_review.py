"""Access reviews as regulated sites run them (issue 41 item 6): a token may carry an expiry, after which it is
refused like a revoked one, and every token records its last use, so `gpuledger token list` and GET /v1/tokens show
the tokens nobody uses and those about to expire."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest

from gpuledger.analytics.config import Config
from gpuledger.analytics.store.access import AccessError, Role, create_token, list_tokens
from gpuledger.analytics.windows import utc_now
from gpuledger.deploy.cli import main
from tests.helpers import api_client

ADMIN = "t0ken-for-tests"


def test_an_expired_token_is_refused_and_use_is_recorded(file_store):
    _, soon = create_token(file_store, "short", Role.parse("reader"), "test", expires=utc_now() + timedelta(seconds=2))
    _, idle = create_token(file_store, "idle", Role.parse("reader"), "test")
    with pytest.raises(AccessError, match="future"):
        create_token(file_store, "late", Role.parse("reader"), "test", expires=utc_now() - timedelta(minutes=1))
    with api_client(file_store, Config(), token=ADMIN) as client:
        assert client.get("/v1/teams", headers={"Authorization": f"Bearer {soon}"}).status_code == 200
        time.sleep(2.2)  # past its expiry, while the server still holds it in its token cache
        refused = client.get("/v1/teams", headers={"Authorization": f"Bearer {soon}"})
        assert refused.status_code == 401 and "expired" in refused.json()["detail"]
        made = client.post("/v1/tokens", headers={"Authorization": f"Bearer {ADMIN}"},
                           json={"name": "quarterly", "role": "reader", "expires_in_days": 90})
        assert made.status_code == 201, made.text
        assert made.json()["expires"] and made.json()["last_used"] is None
        listed = {t["name"]: t for t in client.get("/v1/tokens", headers={"Authorization": f"Bearer {ADMIN}"}).json()}
    assert listed["short"]["last_used"] is not None  # used once: recorded
    assert listed["idle"]["last_used"] is None and listed["idle"]["expires"] is None
    assert idle  # never sent: the review's "never used"
    tokens = list_tokens(file_store).set_index("name")
    assert tokens.loc["quarterly", "expires"] > utc_now() + timedelta(days=89)


def test_token_create_expires_and_list_shows_expiry_and_last_use(tmp_path, capsys):
    db = str(tmp_path / "t.duckdb")
    assert main(["token", "create", "--role", "reader", "--name", "ci", "--expires", "90d", "--db", db]) == 0
    assert "expires 20" in capsys.readouterr().err
    assert main(["token", "list", "--db", db]) == 0
    line = capsys.readouterr().out
    assert "ci" in line and ", expires 20" in line and "never used" in line, line


def test_the_weekly_admin_page_reviews_access_and_no_team_page_names_a_token(tmp_path):
    """Issue 41 item 6: the admin report lists tokens by role, the unused ones and those about to expire."""
    from gpuledger.analytics.report import write_weekly_report
    from gpuledger.analytics.store import Store
    from gpuledger.analytics.store.access import record_use
    from gpuledger.analytics.windows import iso_week
    from tests.helpers import gpu_rows, table
    store = Store(tmp_path / "r.duckdb")
    store.set_rates(Config().rates)
    start, end, label = iso_week("current")
    began = max(start, utc_now() - timedelta(hours=3)).replace(microsecond=0)
    store.append_samples(table(gpu_rows("h", 0, "H100", 60, step_s=60.0, start=began, job="nlp/j", team="nlp")))
    store.fold()
    used, _ = create_token(store, "used-daily", Role.parse("reader"), "test")
    record_use(store, used.id, utc_now())
    create_token(store, "forgotten-agent", Role.parse("agent:n1"), "test")
    create_token(store, "contractor", Role.parse("team:nlp"), "test", expires=utc_now() + timedelta(days=3))
    files = write_weekly_report(store, Config(), tmp_path / "rep", start, end, label, [])
    page = files.html.read_text()
    review = page[page.index("<h2>Access review</h2>"):]
    assert "1 agent" in review and "1 reader" in review and "1 team" in review, review[:400]
    assert "forgotten-agent" in review and "never used" in review
    assert "contractor" in review and ("expires in 2 day(s)" in review or "expires in 3 day(s)" in review)
    assert "used-daily" not in review  # used today, no expiry: nothing to look at
    for team_page in files.team_pages.values():
        text = team_page.read_text()
        assert "forgotten-agent" not in text and "Access review" not in text
    store.close()
