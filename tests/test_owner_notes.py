"""Each user's own jobs (issue 44 item 5): the per-user view a team lead reads (GET /v1/users) and the note to a
job's owner (GET /v1/users/notes, `gpuledger notes`, mailed with --send), on a store where one user works in two
teams: a note never names another team's job, whoever reads it and however it is delivered."""
from __future__ import annotations

import os
import subprocess
from datetime import timedelta

import pytest

from gpuledger.analytics.config import Config
from gpuledger.analytics.owner_notes import owner_notes, user_table
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import Role, create_token
from gpuledger.analytics.waste import job_table
from gpuledger.analytics.windows import utc_now
from tests.helpers import api_client, gpu_rows, table
from tests.procs import GPULEDGER, free_port

H100_RATE = Config().rates["H100"]
NO_SERVER_ENV = {k: v for k, v in os.environ.items() if k not in ("GPULEDGER_SERVER", "GPULEDGER_TOKEN")}


@pytest.fixture
def store_and_window(tmp_path):
    """Two hours on six H100s ending now: alice idle in nlp and idle in vision, bob on a sliver of a card in nlp,
    carol busy in nlp, an idle nlp job without an owner."""
    end = utc_now().replace(second=0, microsecond=0)
    start = end - timedelta(hours=2)
    rows = [gpu_rows("h", 0, "H100", 120, start=start, util=0.0, job="nlp/idle-1", team="nlp", user="alice"),
            gpu_rows("h", 1, "H100", 120, start=start, util=0.0, job="vision/idle-2", team="vision", user="alice"),
            gpu_rows("h", 2, "H100", 120, start=start, util=10.0, mem_used=2000.0, job="nlp/small", team="nlp",
                     user="bob"),
            gpu_rows("h", 3, "H100", 120, start=start, util=90.0, mem_used=60000.0, job="nlp/busy", team="nlp",
                     user="carol"),
            gpu_rows("h", 4, "H100", 120, start=start, util=0.0, job="nlp/anon", team="nlp")]
    db = tmp_path / "owners.duckdb"
    store = Store(db)
    store.set_rates(Config().rates)
    store.append_samples(table(*rows))
    store.fold()
    yield store, db, start - timedelta(minutes=5), end + timedelta(minutes=5)
    store.close()


def _teams_of_jobs(store, start, end) -> dict[str, str]:
    jobs = job_table(store, start, end, limit=10_000)
    return dict(zip(jobs["job_id"], jobs["team"]))


def test_the_team_leads_view_has_each_users_cost_and_idle_hours(store_and_window):
    store, _, start, end = store_and_window
    users = user_table(store, start, end, Config())
    rows = {(r.team, None if r.user is None or r.user != r.user else r.user): r for r in users.itertuples()}
    assert set(rows) == {("nlp", "alice"), ("vision", "alice"), ("nlp", "bob"), ("nlp", "carol"), ("nlp", None)}
    alice = rows["nlp", "alice"]
    assert alice.jobs == 1 and alice.gpu_hours == pytest.approx(2.0) and alice.cost_usd == pytest.approx(
        2.0 * H100_RATE, abs=0.01)
    assert alice.idle_gpu_hours == pytest.approx(2.0) and alice.mean_util_pct == pytest.approx(0.0)
    assert rows["nlp", "carol"].flagged_jobs == 0 and rows["nlp", "carol"].mean_util_pct == pytest.approx(90.0)
    assert rows["nlp", "bob"].flagged_jobs == 1  # peak memory 2 GB of 80
    assert users["cost_usd"].sum() == pytest.approx(5 * 2.0 * H100_RATE, abs=0.05)  # every job once


def test_each_owner_gets_a_note_per_team_naming_only_that_teams_jobs(store_and_window):
    store, _, start, end = store_and_window
    found = owner_notes(store, start, end, Config())
    notes = {(n["team"], n["user"]): n for n in found["notes"]}
    assert set(notes) == {("nlp", "alice"), ("vision", "alice"), ("nlp", "bob")}  # carol wasted nothing
    assert found["jobs_without_owner"] == 1  # nlp/anon: counted, never put on someone
    team_of = _teams_of_jobs(store, start, end)
    for (team, _), note in notes.items():
        assert {team_of[j["job_id"]] for j in note["jobs"]} == {team}
    idle = notes["nlp", "alice"]["jobs"][0]["findings"]
    assert [f["finding"] for f in idle] == ["idle"] and idle[0]["wasted_usd"] == pytest.approx(2 * H100_RATE,
                                                                                              abs=0.01)
    small = notes["nlp", "bob"]["jobs"][0]["findings"]
    assert [f["finding"] for f in small] == ["oversized"] and "H100 MIG 1g.10gb" in small[0]["change"]
    assert small[0]["wasted_usd"] == pytest.approx(2 * H100_RATE * 6 / 7, abs=0.01)  # a seventh would do
    assert owner_notes(store, start, end, Config(), user="bob")["notes"][0]["user"] == "bob"
    for note in found["notes"]:  # a note's total is the sum of the cents it lists
        listed = [f["wasted_usd"] for j in note["jobs"] for f in j["findings"] if f["wasted_usd"] is not None]
        assert note["wasted_usd"] == round(sum(listed), 2) and all(x == round(x, 2) for x in listed)


def test_a_team_token_reads_its_own_teams_users_and_notes_only(store_and_window):
    store, _, start, end = store_and_window
    _, nlp = create_token(store, "nlp-lead", Role.parse("team:nlp"), "test")
    params = {"days": (end - start).total_seconds() / 86400, "end": end.isoformat()}
    with api_client(store, Config()) as client:
        auth = {"Authorization": f"Bearer {nlp}"}
        users = client.get("/v1/users", params=params, headers=auth)
        notes = client.get("/v1/users/notes", params=params, headers=auth)
        other = client.get("/v1/users/notes", params={**params, "team": "vision"}, headers=auth)
        anonymous = client.get("/v1/users/notes", params=params)
    assert users.status_code == 200 and {r["team"] for r in users.json()} == {"nlp"}
    assert notes.status_code == 200 and {(n["team"], n["user"]) for n in notes.json()["notes"]} == {
        ("nlp", "alice"), ("nlp", "bob")}
    assert "vision" not in notes.text and "vision" not in users.text
    assert other.status_code == 403 and anonymous.status_code == 401


def _notes(db, *args, config=None):
    extra = ["--config", str(config)] if config else []
    return subprocess.run([GPULEDGER, "notes", "--db", str(db), "--days", "1", *extra, *args], capture_output=True,
                          text=True, timeout=300, env=NO_SERVER_ENV)


def test_notes_are_mailed_to_each_owner_once_per_team_and_never_carry_another_teams_job(store_and_window, tmp_path):
    from aiosmtpd.controller import Controller
    store, db, _, _ = store_and_window
    store.close()
    received = []

    class Inbox:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's handler API
            received.append((envelope.rcpt_tos, envelope.content.decode(errors="replace")))
            return "250 OK"
    port = free_port()
    controller = Controller(Inbox(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        site = tmp_path / "site.toml"
        site.write_text(f'[report.email]\nhost = "127.0.0.1"\nport = {port}\nstarttls = false\n'
                        f'owner_address = "{{user}}@example.org"\n')
        sent = _notes(db, "--send", "--out", str(tmp_path / "notes"), config=site)
    finally:
        controller.stop()
    assert sent.returncode == 0, sent.stderr
    assert "mailed 3 note(s)" in sent.stderr
    by_team = {}
    for to, content in received:
        team = "vision" if "team vision" in content else "nlp"
        by_team[(team, tuple(to))] = content
    assert set(by_team) == {("nlp", ("alice@example.org",)), ("vision", ("alice@example.org",)),
                            ("nlp", ("bob@example.org",))}
    assert "vision/idle-2" not in by_team["nlp", ("alice@example.org",)]
    assert "nlp/" not in by_team["vision", ("alice@example.org",)]
    assert (tmp_path / "notes" / "vision" / "alice.md").read_text().count("## Job ") == 1
    # nothing is sent where the site did not say how to reach owners
    refused = _notes(db, "--send")
    assert refused.returncode == 2 and "owner_address" in refused.stderr


def test_owner_address_must_hold_the_user_once(tmp_path):
    from gpuledger.analytics.config import ConfigError, load_config
    site = tmp_path / "site.toml"
    site.write_text('[report.email]\nhost = "h"\nowner_address = "gpu-notes@example.org"\n')
    with pytest.raises(ConfigError, match="owner_address"):
        load_config(site)
