"""A bill says what it rests on (issue 45 item 4): a November statement whose samples begin on the 23rd carries its
coverage (hours with samples over the period's hours) and a note naming the hours, in the API, the CLI's text, its
page and every FOCUS row; a period fully sampled carries the figures and no note."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.focus_export import focus_rows
from gpuledger.analytics.ledger import statement
from gpuledger.analytics.report import write_statement
from gpuledger.deploy.cli import statement_text
from tests.helpers import api_client, gpu_rows, table

NOW = datetime(2026, 12, 7, tzinfo=timezone.utc)


def _november_from_the_23rd(store) -> None:
    start = datetime(2026, 11, 23, tzinfo=timezone.utc)
    store.append_samples(table(gpu_rows("h", 0, "H100", 8 * 24 * 60, step_s=600.0, start=start, util=50.0,
                                        job="nlp/a", team="nlp")))
    store.fold()


def test_a_statement_whose_samples_start_late_says_so_everywhere(file_store, tmp_path):
    _november_from_the_23rd(file_store)
    config = Config()
    found = statement(file_store, config.ledger, "2026-11", now=NOW)
    cover = found["coverage"]
    assert cover["hours_in_period"] == 720 and cover["hours_elapsed"] == 720
    assert cover["hours_with_data"] == 8 * 24 and cover["share"] == round(192 / 720, 4)
    assert pd.Timestamp(cover["first_hour"]) == pd.Timestamp("2026-11-23", tz="UTC")
    assert "192 of the 720 hours (27%), from 2026-11-23 00:00 to 2026-11-30 23:00 UTC" in cover["note"]
    assert "coverage: samples cover 192 of the 720 hours (27%)" in statement_text(found)
    _, page = write_statement(found, tmp_path / "st")
    assert "<strong>Coverage</strong>: Samples in 192 of the period" in page.read_text()
    rows = focus_rows(found)
    assert (rows["x_CoveredHours"] == 192).all() and (rows["x_PeriodHours"] == 720).all()
    assert rows["x_CoverageNote"].str.contains("27%").all()
    with api_client(file_store, config, open_reads=True) as client:
        answer = client.get("/v1/ledger/statements/2026-11").json()
    assert answer["coverage"]["hours_with_data"] == 192 and answer["coverage"]["note"]


def test_a_fully_sampled_period_has_no_note(file_store):
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    file_store.append_samples(table(gpu_rows("h", 0, "H100", 30 * 24 * 60, step_s=1800.0, start=start, util=50.0,
                                             job="nlp/a", team="nlp")))
    file_store.fold()
    cover = statement(file_store, Config().ledger, "2026-11", now=NOW + timedelta(days=30))["coverage"]
    assert cover["hours_with_data"] == 720 and cover["share"] == 1.0 and cover["note"] is None
