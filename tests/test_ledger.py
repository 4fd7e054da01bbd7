"""The ledger: dated rate cards, periods that close after their grace, stored statements that never change, and
adjustments booked into the next open period; through the analytics, the API, the weekly report and the CLI."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pandas as pd
import pytest

from gpuledger.analytics.config import Config, ConfigError, LedgerConfig, load_config
from gpuledger.analytics.cost import cost_by_team, cost_by_team_and_model
from gpuledger.analytics.focus_export import focus_rows, write_focus
from gpuledger.analytics.ledger import adjust, close_due, parse_period, periods, statement
from gpuledger.analytics.report import write_weekly_report
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import Role, check_audit, create_token
from gpuledger.analytics.store.rates import ClosedPeriodError
from gpuledger.collector.samples import IDLE_CAPACITY
from gpuledger.deploy.cli import main
from tests.focus_validator import validate
from tests.helpers import api_client, gpu_rows, table

UTC = timezone.utc
START = datetime(2026, 11, 23, tzinfo=UTC)  # Monday of ISO week 2026-W48
DEC = datetime(2026, 12, 1, tzinfo=UTC)
AFTER_GRACE = datetime(2026, 12, 5, tzinfo=UTC)  # November's grace (3 days) is over on December 4
LEDGER = LedgerConfig()
H100 = Config().rates["H100"]
L4 = Config().rates["L4"]


def _fill(store: Store) -> Store:
    """Ten days of one busy and one free H100 (Nov 23 - Dec 3) and four days of an L4 across the month's end,
    sampled every 10 minutes."""
    store.set_rates(Config().rates)
    store.append_samples(table(
        gpu_rows("n1", 0, "H100", 10 * 1440, step_s=600, start=START, util=50.0, job="a/1", team="a"),
        gpu_rows("n1", 1, "H100", 10 * 1440, step_s=600, start=START),
        gpu_rows("n2", 0, "L4", 4 * 1440, step_s=600, start=DEC - timedelta(days=2), util=80.0, job="b/1",
                 team="b", mem_total=23034),
    ))
    store.fold()
    return store


@pytest.fixture
def ledger(file_store) -> Store:
    return _fill(file_store)


def _cents(value: float) -> int:
    return int(Decimal(str(value)).scaleb(2))


def test_periods_close_once_after_their_grace_and_a_statement_adds_up_to_the_cent(ledger):
    assert close_due(ledger, LEDGER, DEC + timedelta(days=3) - timedelta(seconds=1)) == []
    assert close_due(ledger, LEDGER, AFTER_GRACE, by="test") == ["2026-11"]
    assert close_due(ledger, LEDGER, AFTER_GRACE) == []  # closed once
    found = statement(ledger, LEDGER, "2026-11", AFTER_GRACE)
    assert found["state"] == "closed" and found["closed_by"] == "test"
    lines = {(r["team"], r["gpu_model"]): r for r in found["lines"]}
    # a/1: Nov 23-30, 8 days at the H100 rate; the free H100 the idle-capacity line; b/1's L4: Nov 29-30
    assert lines[("a", "H100")]["gpu_hours"] == pytest.approx(8 * 24)
    assert lines[("a", "H100")]["cost_usd"] == round(8 * 24 * H100, 2)
    assert lines[(IDLE_CAPACITY, "H100")]["cost_usd"] == round(8 * 24 * H100, 2)
    assert lines[("b", "L4")]["gpu_hours"] == pytest.approx(48) and lines[("b", "L4")]["rate_card"] == "[rates]"
    assert _cents(found["total_usd"]) == sum(_cents(r["cost_usd"]) for r in found["lines"])
    assert _cents(found["total_usd"]) == sum(_cents(t["total_usd"]) for t in found["teams"])
    assert found["teams"][-1]["team"] == IDLE_CAPACITY
    states = {p["period"]: p["state"] for p in periods(ledger, LEDGER, AFTER_GRACE)}
    assert states == {"2026-11": "closed", "2026-12": "open"}
    # a sample arriving after the close changes the live figures, never the stored statement
    ledger.append_samples(table(gpu_rows("n3", 0, "H100", 60, step_s=600, start=DEC - timedelta(hours=2),
                                         util=90.0, job="a/2", team="a")))
    assert statement(ledger, LEDGER, "2026-11", AFTER_GRACE) == found
    live = cost_by_team(ledger, START, DEC).set_index("team")
    assert live.loc["a", "cost_usd"] == pytest.approx((8 * 24 + 1) * H100)


def test_a_rate_dated_after_a_closed_period_changes_no_figure_of_it_and_prices_only_later_samples(stack, ledger,
                                                                                               tmp_path):
    """Done when: the closed statement, the report and the API say the same to the cent before and after a new
    rate dated after the close; the new rate prices only the samples from its start."""
    close_due(ledger, LEDGER, AFTER_GRACE)
    client = stack.enter_context(api_client(ledger, Config(), open_reads=True))

    seen: list[tuple] = []

    def figures() -> tuple:
        costs = client.get("/v1/costs", params={"days": 8, "end": DEC.isoformat()}).json()
        api_statement = client.get("/v1/ledger/statements/2026-11").json()
        report = write_weekly_report(ledger, Config(), tmp_path / f"r{len(seen)}", START, START + timedelta(days=7),
                                     "2026-W48", [])
        return (costs["teams"], costs["cluster_total_usd"], api_statement["lines"], api_statement["total_usd"],
                report.summary_csv.read_text(), statement(ledger, LEDGER, "2026-11", AFTER_GRACE)["lines"])

    seen.append(figures())
    change = DEC + timedelta(hours=12)
    ledger.set_rates(Config().rates, [("H100", change, 1.0)])
    seen.append(figures())
    assert seen[0][:4] == seen[1][:4] and seen[0][5] == seen[1][5]
    assert seen[0][4].splitlines()[1:] == seen[1][4].splitlines()[1:]  # the weekly report's rows
    # December: 12 hours at the old rate, then the new one; each line names the version that priced it
    by_version = cost_by_team_and_model(ledger, DEC, DEC + timedelta(days=1), "a").set_index("rate_card")
    assert by_version.loc["[rates]", "cost_usd"] == pytest.approx(12 * H100)
    assert by_version.loc["from 2026-12-01 12:00 UTC", "cost_usd"] == pytest.approx(12 * 1.0)
    draft = client.get("/v1/ledger/statements/2026-12").json()
    assert draft["state"] == "open"
    assert {line["rate_card"] for line in draft["lines"] if line["gpu_model"] == "H100"} == {
        "[rates]", "from 2026-12-01 12:00 UTC"}
    rates = client.get("/v1/costs", params={"days": 2, "end": (DEC + timedelta(days=1)).isoformat()}).json()["rates"]
    assert {(r["gpu_model"], r["rate_card"]) for r in rates if r["gpu_model"] == "H100"} == {
        ("H100", "[rates]"), ("H100", "from 2026-12-01 12:00 UTC")}


def test_a_card_that_would_reprice_a_closed_period_is_refused_whole_and_says_what_to_do(ledger):
    close_due(ledger, LEDGER, AFTER_GRACE)
    before = ledger.rate_history()
    with pytest.raises(ClosedPeriodError, match=r"H100 from 2026-11-01 00:00 UTC: \$6.88/GPU-hour -> \$2/GPU-hour "
                                                r"\(closed period 2026-11\).*on or after 2026-12-01 00:00 UTC"):
        ledger.set_rates({**Config().rates, "H100": 2.0})
    with pytest.raises(ClosedPeriodError, match="closed period 2026-11"):
        ledger.set_rates(Config().rates, [("L4", datetime(2026, 11, 30, 6, tzinfo=UTC), 0.1)])
    with pytest.raises(ClosedPeriodError, match="L4"):  # a model losing its rate re-prices it too (unpriced)
        ledger.set_rates({m: r for m, r in Config().rates.items() if m != "L4"})
    assert ledger.rate_history().equals(before)  # nothing of a refused card was written
    ledger.set_rates({**Config().rates, "B200": 9.9})  # a model no closed statement billed: no refusal
    assert ledger.current_rates()["B200"] == 9.9
    assert ledger.set_rates(Config().rates, [("H100", DEC, 2.0)])  # open time: re-priced, and said so
    assert ledger.current_rates()["H100"] == 2.0


def test_adjustments_are_booked_into_the_next_open_period_with_who_and_why_and_audited(stack, ledger):
    close_due(ledger, LEDGER, AFTER_GRACE)
    _, team_token = create_token(ledger, "lead-b", Role.parse("team:b"), "test")
    client = stack.enter_context(api_client(ledger, Config(), token="root"))
    admin = {"Authorization": "Bearer root"}
    body = {"team": "a", "usd": -125.5, "reason": "a/1 ran on a faulty node for 20 hours", "corrects": "2026-11"}
    booked = client.post("/v1/ledger/adjustments", json=body, headers=admin)
    assert booked.status_code == 201, booked.text
    assert booked.json()["period"] == "2026-12" and booked.json()["corrects"] == "2026-11"
    assert booked.json()["made_by"] == "bootstrap"
    closed = client.get("/v1/ledger/statements/2026-11", headers=admin).json()
    assert closed["adjustments"] == []  # a closed statement never changes
    december = client.get("/v1/ledger/statements/2026-12", headers=admin).json()
    team_a = next(t for t in december["teams"] if t["team"] == "a")
    assert team_a["adjustments_usd"] == -125.5
    assert _cents(team_a["total_usd"]) == _cents(team_a["usage_usd"]) - 12550
    assert _cents(december["total_usd"]) == sum(_cents(t["total_usd"]) for t in december["teams"])
    # a team token sees its own and the shared lines, never another team's adjustment
    seen = client.get("/v1/ledger/statements/2026-12", headers={"Authorization": f"Bearer {team_token}"}).json()
    assert {line["team"] for line in seen["lines"]} <= {"b", IDLE_CAPACITY, "unattributed"}
    assert seen["adjustments"] == [] and "a" not in {t["team"] for t in seen["teams"]}
    assert _cents(seen["total_usd"]) == sum(_cents(t["total_usd"]) for t in seen["teams"])  # its own share only
    assert seen["cluster_total_usd"] == december["total_usd"]
    bad = [({**body, "team": "nobody"}, 404), ({**body, "usd": 0}, 422), ({**body, "reason": " "}, 422),
           ({**body, "corrects": "2026-13"}, 422), ({**body, "corrects": "2026-W48"}, 422),
           ({**body, "corrects": "2027-01"}, 422), ({**body, "usd": 1e12}, 422),
           ({**body, "reason": "ok\r=1+1"}, 422), ({**body, "reason": "\x1b[31mred"}, 422),
           ({**body, "usd": 1.234}, 422), ({**body, "usd": True}, 422), ({**body, "usd": "12.5"}, 422),
           ({**body, "corrects": "2026-10"}, 422)]  # before the ledger's first period
    for request, status in bad:
        answer = client.post("/v1/ledger/adjustments", json=request, headers=admin)
        assert answer.status_code == status, (request, answer.text)
    refused = client.post("/v1/ledger/adjustments", json=body, headers={"Authorization": f"Bearer {team_token}"})
    assert refused.status_code == 403
    entries = ledger.query("SELECT detail FROM audit_log WHERE target LIKE '%/v1/ledger/adjustments%' AND status = 201")
    assert len(entries) == 1 and "a/1 ran on a faulty node" in entries["detail"].iloc[0]
    assert check_audit(ledger).intact


def test_the_statement_command_closes_what_is_due_prints_writes_and_refuses_an_open_period(tmp_path, capsys):
    db = tmp_path / "ledger.duckdb"
    with Store(db) as store:
        _fill(store)
    out = tmp_path / "out"
    # November's grace is long over today: the command closes it, then prints and writes its statement
    assert main(["statement", "--db", str(db), "--period", "2026-11", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "closed period 2026-11" in printed.err and "(final)" in printed.out
    csv = (out / "statement-2026-11.csv").read_text().splitlines()
    assert csv[0].startswith("kind,period,state,team,shared_from,gpu_model,rate_card") and len(csv) == 4
    assert (out / "statement-2026-11.html").exists()
    assert main(["statement", "--db", str(db), "--period", "2026-11", "--team", "b", "--out", str(out)]) == 0
    assert f"total USD {round(48 * L4, 2):,.2f}" in capsys.readouterr().out
    assert main(["statement", "--db", str(db), "--period", "2026-11", "--team", "zz", "--out", str(out)]) == 2
    assert "teams on it: a, b, __idle__" in capsys.readouterr().err
    current = datetime.now(UTC).strftime("%Y-%m")
    assert main(["statement", "--db", str(db), "--period", current, "--out", str(out)]) == 2
    assert "add --draft" in capsys.readouterr().err
    assert main(["statement", "--db", str(db), "--period", "2026-W48", "--out", str(out)]) == 2
    assert "periods are months" in capsys.readouterr().err
    # the config's H100 rate changed after the close: refused at load, naming the closed period
    config = tmp_path / "site.toml"
    config.write_text("[rates]\nH100 = 3.0\n")
    assert main(["collect", "--db", str(db), "--config", str(config), "--source", "simulator", "--count", "1"]) == 2
    assert "closed period 2026-11" in capsys.readouterr().err


def test_a_rate_card_needs_dated_whole_hour_starts_no_overlap_and_no_negative_price(tmp_path):
    def load(text: str) -> Config:
        path = tmp_path / "c.toml"
        path.write_text(text)
        return load_config(path)

    config = load("[[rate_cards]]\nfrom = 2026-12-01\nH100 = 5.5\n[[rate_cards]]\n"
                  "from = 2026-11-15T08:00:00+02:00\nL4 = 0.7\n")
    assert config.dated_rates() == [("L4", datetime(2026, 11, 15, 6, tzinfo=UTC), 0.7),
                                    ("H100", datetime(2026, 12, 1, tzinfo=UTC), 5.5)]
    for text, message in [
        ("[[rate_cards]]\nH100 = 5.5\n", "has no `from`"),
        ("[[rate_cards]]\nfrom = 2026-12-01\nH100 = 5\n[[rate_cards]]\nfrom = 2026-12-01T00:00:00Z\nL4 = 1\n",
         "overlapping"),
        ("[[rate_cards]]\nfrom = 2026-12-01\nH100 = -1\n", "must be a number >= 0"),
        ("[[rate_cards]]\nfrom = 2026-12-01T08:30:00Z\nH100 = 5\n", "whole UTC hour"),
        ("[[rate_cards]]\nfrom = 2026-12-01T08:00:00\nH100 = 5\n", "has no offset"),
        ("[[rate_cards]]\nfrom = 2026-12-01\n", "sets no rate"),
        ("[[rate_cards]]\nfrom = \"soon\"\nH100 = 5\n", "must be a date"),
        ("[ledger]\nperiod = \"quarter\"\n", "must be one of month, week"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load(text)


def test_weekly_periods_and_an_older_store_whose_rates_were_undated(tmp_path):
    assert parse_period("2026-W48", "week").start == START
    assert parse_period("2026-12", "month").end == datetime(2027, 1, 1, tzinfo=UTC)
    weekly = LedgerConfig(period="week", grace_days=1)
    with Store(tmp_path / "w.duckdb") as store:
        _fill(store)
        assert close_due(store, weekly, AFTER_GRACE) == ["2026-W48"]  # W49 ends Dec 7: not due yet
        found = statement(store, weekly, "2026-W48", AFTER_GRACE)
        assert found["end"] == START + timedelta(days=7)
        with pytest.raises(Exception, match="does not start a month"):
            close_due(store, LEDGER, AFTER_GRACE + timedelta(days=60))
    import duckdb
    old = tmp_path / "old.duckdb"
    with duckdb.connect(str(old)) as con:  # a schema-13 store's rate card: one undated rate per model
        con.execute("CREATE TABLE rate_card (gpu_model VARCHAR PRIMARY KEY, usd_per_gpu_hour DOUBLE NOT NULL)")
        con.execute("INSERT INTO rate_card VALUES ('H100', 4.25)")
    with Store(old) as store:
        assert store.current_rates() == {"H100": 4.25}
        assert store.rate_history()["rate_card"].tolist() == ["[rates]"]


def test_the_api_lists_periods_and_refuses_periods_outside_the_ledger(stack, ledger):
    close_due(ledger, LEDGER, AFTER_GRACE)
    client = stack.enter_context(api_client(ledger, Config(), open_reads=True))
    listed = client.get("/v1/ledger/periods").json()
    assert [(p["period"], p["state"]) for p in listed][:2] == [("2026-11", "closed"), ("2026-12", "open")]
    assert listed[0]["closes_at"].startswith("2026-12-04") and listed[0]["total_usd"] == statement(
        ledger, LEDGER, "2026-11")["total_usd"]
    before = client.get("/v1/ledger/statements/2026-10")
    assert before.status_code == 404 and "first period, 2026-11" in before.json()["detail"]
    assert client.get("/v1/ledger/statements/2199-01").status_code == 404
    assert client.get("/v1/ledger/statements/Robert'); DROP TABLE x").status_code == 422


def _shared_cluster(store: Store) -> Store:
    """Two nodes of H100s (team a and an idle GPU on n1; team b, the platform team and an idle GPU on n2), an L4
    nobody holds on n3 and an unpriced card team c holds; 7-minute samples and odd hours, so cents do not fall
    evenly."""
    store.set_rates(Config().rates)
    start = DEC + timedelta(hours=1)
    store.append_samples(table(
        gpu_rows("n1", 0, "H100", 7 * 101, step_s=420, start=start, util=40.0, job="a/1", team="a"),
        gpu_rows("n1", 1, "H100", 7 * 133, step_s=420, start=start),
        gpu_rows("n2", 0, "H100", 7 * 89, step_s=420, start=start, util=70.0, job="b/1", team="b"),
        gpu_rows("n2", 1, "H100", 7 * 61, step_s=420, start=start, util=20.0, job="p/1", team="platform"),
        gpu_rows("n2", 2, "H100", 7 * 77, step_s=420, start=start),
        gpu_rows("n3", 0, "L4", 7 * 59, step_s=420, start=start, mem_total=23034),
        gpu_rows("n3", 1, "Z9000", 7 * 31, step_s=420, start=start, util=5.0, job="c/1", team="c"),
    ))
    store.fold()
    return store


SPLIT_MODES = {
    "own line": LedgerConfig(),
    "idle shared by cluster": LedgerConfig(idle="shared"),
    "idle shared by node": LedgerConfig(idle="shared", idle_by="node"),
    "platform spread by cost": LedgerConfig(shared_teams=("platform",)),
    "idle by node, platform spread evenly": LedgerConfig(idle="shared", idle_by="node", shared_teams=("platform",),
                                                         share_by="even"),
}


@pytest.mark.parametrize("mode", SPLIT_MODES)
def test_every_split_mode_adds_up_to_the_cluster_cost_to_the_cent(file_store, mode):
    store = _shared_cluster(file_store)
    config = SPLIT_MODES[mode]
    end = DEC + timedelta(days=1)
    found = statement(store, config, "2026-12", end)
    exact = float(cost_by_team(store, DEC, end)["cost_usd"].sum())
    assert _cents(found["total_usd"]) == round(exact * 100)  # the cluster's cost, rounded once
    assert _cents(found["total_usd"]) == sum(_cents(line["cost_usd"]) for line in found["lines"])
    assert _cents(found["total_usd"]) == sum(_cents(t["total_usd"]) for t in found["teams"])
    assert sum(line["gpu_hours"] for line in found["lines"]) == pytest.approx(
        float(cost_by_team(store, DEC, end)["gpu_hours"].sum()))  # and no GPU-hour is lost or counted twice
    assert all(line["cost_usd"] >= 0 for line in found["lines"])
    assert found["split"] == ("idle capacity its own line" if config.idle == "own_line"
                              else f"idle shared by {config.idle_by}") + (
        f"; platform spread by {config.share_by}" if config.shared_teams else "")
    teams = {t["team"]: t["total_usd"] for t in found["teams"]}
    idle_models = {line["gpu_model"] for line in found["lines"] if line["team"] == IDLE_CAPACITY}
    assert idle_models == ({"H100", "L4"} if config.idle == "own_line" else {"L4"})  # nobody allocated the L4
    assert ("platform" in teams) == (not config.shared_teams)
    unpriced = [line for line in found["lines"] if line["gpu_model"] == "Z9000"]
    assert unpriced and all(line["rate_card"] is None and line["cost_usd"] == 0 for line in unpriced)
    if config.idle_by == "node":  # n1's idle H100 went to team a alone, n2's to b and the platform team
        shares = {line["team"]: line["gpu_hours"] for line in found["lines"] if line["kind"] == "idle share"}
        n2_idle = 77 * 7 / 60
        assert shares["a"] == pytest.approx(133 * 7 / 60)
        assert shares["b"] == pytest.approx(n2_idle * 89 / (89 + 61))


def test_a_closed_statement_keeps_the_split_it_closed_with(file_store):
    store = _shared_cluster(file_store)
    later = datetime(2027, 1, 10, tzinfo=UTC)
    assert close_due(store, LedgerConfig(idle="shared"), later) == ["2026-12"]
    closed = statement(store, LedgerConfig(idle="shared"), "2026-12", later)
    assert statement(store, LedgerConfig(), "2026-12", later) == closed  # a new [ledger] idle changes no closed bill
    assert closed["split"] == "idle shared by cluster"
    assert {line["kind"] for line in closed["lines"]} == {"usage", "idle share"}


def test_the_focus_export_passes_the_finops_validator_and_adds_up_to_the_statement(tmp_path, capsys):
    """Done when: the FOCUS export passes focus-validator with no failed rule. Every kind of row is in it: own
    use, idle shares, a shared-cost team spread, an unpriced card, idle capacity nobody allocated, an adjustment."""
    db = tmp_path / "focus.duckdb"
    config = LedgerConfig(idle="shared", idle_by="node", shared_teams=("platform",))
    later = datetime(2027, 1, 10, tzinfo=UTC)
    with Store(db) as store:
        _shared_cluster(store)
        adjust(store, config, "b", -12.34, "b/1 was preempted by maintenance", "2026-12", "ops",
               {"a", "b", "c"}, now=DEC + timedelta(days=2))
        close_due(store, config, later)
        found = statement(store, config, "2026-12", later)
    rows = focus_rows(found)
    assert {"usage", "idle share", "shared cost", "adjustment"} <= set(rows["x_LineKind"])
    assert set(rows["ChargeCategory"]) == {"Usage", "Adjustment"} and rows["BilledCost"].notna().all()
    assert _cents(round(float(rows["BilledCost"].sum()), 2)) == _cents(found["total_usd"])
    csv = tmp_path / "focus.csv"
    write_focus(rows, csv, "csv")
    checked = validate(csv)
    assert checked.returncode == 0 and "Validation succeeded" in checked.stdout, checked.stdout + checked.stderr
    assert "failed" not in checked.stdout.lower()
    parquet = tmp_path / "focus.parquet"
    write_focus(rows, parquet, "parquet")
    back = pd.read_parquet(parquet)
    assert list(back.columns) == list(rows.columns) and back["BilledCost"].sum() == pytest.approx(
        rows["BilledCost"].sum())
    assert str(back["BillingPeriodStart"].dt.tz) == "UTC"
    # the command writes the same rows (the period is closed: the stored statement)
    out = tmp_path / "cli.csv"
    assert main(["export", "focus", "--db", str(db), "--period", "2026-12", "--out", str(out)]) == 0
    assert pd.read_csv(out)["BilledCost"].sum() == pytest.approx(rows["BilledCost"].sum())
    assert "FOCUS csv" in capsys.readouterr().out


# the fields OpenCost's Allocation marshals to JSON (core/pkg/opencost allocation_json.go), by name
OPENCOST_FIELDS = {
    "name", "properties", "window", "start", "end", "minutes", "cpuCores", "cpuCoreRequestAverage",
    "cpuCoreUsageAverage", "cpuCoreHours", "cpuCost", "cpuCostAdjustment", "cpuEfficiency", "gpuCount", "gpuHours",
    "gpuCost", "gpuCostAdjustment", "networkTransferBytes", "networkReceiveBytes", "networkCost",
    "networkCostAdjustment", "loadBalancerCost", "loadBalancerCostAdjustment", "pvBytes", "pvByteHours", "pvCost",
    "pvCostAdjustment", "ramBytes", "ramByteRequestAverage", "ramByteUsageAverage", "ramByteHours", "ramCost",
    "ramCostAdjustment", "ramEfficiency", "sharedCost", "externalCost", "totalCost", "totalEfficiency",
    "rawAllocationOnly"}


def test_the_opencost_allocation_api_answers_its_documented_queries_with_its_field_names(stack, file_store):
    store = _shared_cluster(file_store)
    _, team_token = create_token(store, "lead-b", Role.parse("team:b"), "test")
    client = stack.enter_context(api_client(store, Config(), token="root"))
    admin = {"Authorization": "Bearer root"}
    day = f"{DEC.isoformat()},{(DEC + timedelta(days=1)).isoformat()}"
    # the queries OpenCost's documentation shows: a window, an aggregate, a step, a resolution (ignored here)
    weekly = client.get("/allocation", headers=admin, params={"window": "7d", "aggregate": "namespace",
                                                              "resolution": "1m"})
    assert weekly.status_code == 200 and weekly.json()["code"] == 200 and len(weekly.json()["data"]) == 1
    stepped = client.get("/allocation/compute", headers=admin, params={
        "window": day, "step": "6h", "resolution": "10m", "aggregate": "team", "includeIdle": "true"}).json()
    assert len(stepped["data"]) == 4
    whole = client.get("/allocation", headers=admin, params={
        "window": day, "aggregate": "team", "accumulate": "true", "includeIdle": "true"}).json()["data"][0]
    for found in whole.values():
        assert OPENCOST_FIELDS <= set(found) and found["window"]["start"] == "2026-12-01T00:00:00Z"
        assert found["totalCost"] == pytest.approx(found["gpuCost"]) and found["minutes"] == 1440
    exact = cost_by_team(store, DEC, DEC + timedelta(days=1)).set_index("team")
    assert sum(a["totalCost"] for a in whole.values()) == pytest.approx(exact["cost_usd"].sum())
    assert sum(a["totalCost"] for s in stepped["data"] for a in s.values()) == pytest.approx(exact["cost_usd"].sum())
    assert whole["a"]["properties"]["labels"] == {"team": "a"} and whole["a"]["gpuCost"] == pytest.approx(
        exact.loc["a", "cost_usd"])
    assert whole["__idle__"]["gpuHours"] == pytest.approx(exact.loc[IDLE_CAPACITY, "gpu_hours"])
    # shared idle: the cost moves to who allocated the same card (the L4 nobody held stays idle), none is lost
    shared = client.get("/allocation", headers=admin, params={
        "window": day, "aggregate": "team", "accumulate": "true", "includeIdle": "true", "shareIdle": "true",
        "idleByNode": "true"}).json()["data"][0]
    assert sum(a["totalCost"] for a in shared.values()) == pytest.approx(exact["cost_usd"].sum())
    assert shared["a"]["gpuCost"] > whole["a"]["gpuCost"] and shared["a"]["gpuHours"] == whole["a"]["gpuHours"]
    by_node = client.get("/allocation", headers=admin, params={"window": day, "aggregate": "node",
                                                               "accumulate": "true"}).json()["data"][0]
    assert set(by_node) == {"n1", "n2", "n3"} and by_node["n1"]["properties"]["node"] == "n1"
    # a team token: its own team and the shared lines only, and no aggregate that names other teams' things
    mine = client.get("/allocation", headers={"Authorization": f"Bearer {team_token}"}, params={
        "window": day, "aggregate": "team", "accumulate": "true", "includeIdle": "true"}).json()["data"][0]
    assert set(mine) == {"b", IDLE_CAPACITY}
    assert client.get("/allocation", headers={"Authorization": f"Bearer {team_token}"},
                      params={"window": day, "aggregate": "node"}).status_code == 403
    for bad in ({"window": "7x"}, {"window": "2026-12-02T00:00:00Z,2026-12-01T00:00:00Z"},
                {"window": "1d", "aggregate": "label:app"}, {"window": "400d"},
                {"window": "7d", "step": "1m"}, {"window": "0001-01-01T00:00:00Z,2026-12-01T00:00:00Z"},
                {"window": "7d", "step": "0h"}, {"window": "0d"}):
        assert client.get("/allocation", headers=admin, params=bad).status_code == 422, bad
    for named in ("today", "yesterday", "week", "month", "lastweek", "lastmonth", "30m", "24h", "2w"):
        assert client.get("/allocation", headers=admin, params={"window": named}).status_code == 200, named
