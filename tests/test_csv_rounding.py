"""Money and quantities rounded at the edge where people and finance tools read them (issue 45 item 5): every CSV
gpuledger writes carries amounts to the cent and quantities to six decimals, never `2226.4250000001957`; storage
and the Parquet FOCUS file stay exact."""
from __future__ import annotations

import re

import pandas as pd

from gpuledger.analytics.records import write_csv

# a float written with more than six decimals, or below 1 with more than six significant digits
NOISE = re.compile(r"(?<![\d.])(?:[1-9]\d*\.\d{7,}|0\.0*[1-9]\d{6,})")


def test_a_csv_rounds_amounts_to_cents_and_quantities_to_six_decimals(tmp_path):
    frame = pd.DataFrame({"team": ["nlp"], "gpu_hours": [2226.4250000001957], "cost_usd": [15318.804000000013],
                          "usd_per_gpu_hour": [6.8812345678], "BilledCost": [1.005000000001], "gpus": [3]})
    path = tmp_path / "x.csv"
    write_csv(frame, path)
    text = path.read_text()
    assert "2226.425," in text and "15318.8," in text and "6.881235," in text and "1.01," in text
    assert not NOISE.search(text), text
    assert frame["gpu_hours"].iloc[0] == 2226.4250000001957  # the caller's frame is not changed


def test_the_weekly_report_and_focus_csvs_carry_no_float_noise(tmp_path):
    from datetime import timedelta

    from gpuledger.analytics.config import Config
    from gpuledger.analytics.focus_export import focus_rows, write_focus
    from gpuledger.analytics.ledger import statement
    from gpuledger.analytics.report import write_weekly_report
    from gpuledger.analytics.store import Store
    from gpuledger.analytics.windows import iso_week, utc_now
    from tests.helpers import gpu_rows, table
    store = Store(tmp_path / "r.duckdb")
    store.set_rates(Config().rates)
    start, end, label = iso_week("current")
    began = max(start, utc_now() - timedelta(hours=20)).replace(microsecond=0)
    # 7-second samples at utilisations that make long binary fractions
    rows = [gpu_rows("h", g, "H100", 90, step_s=7.0, start=began, util=33.3 + g / 7, job=f"t{g}/j", team=f"t{g}")
            for g in range(3)]
    store.append_samples(table(*rows))
    store.fold()
    files = write_weekly_report(store, Config(), tmp_path / "rep", start, end, label, [])
    written = [files.summary_csv, *files.team_csvs.values()]
    month = f"{pd.Timestamp(began):%Y-%m}"
    write_focus(focus_rows(statement(store, Config().ledger, month)), tmp_path / "focus.csv", "csv")
    written.append(tmp_path / "focus.csv")
    for path in written:
        text = path.read_text()
        assert not NOISE.search(text), (path, NOISE.search(text).group(0))
    store.close()


MONEY_NOISE = re.compile(r'"(?:usd|[a-z_]*_usd(?:_per_(?:day|week|month))?)":-?\d+\.\d{3,}')  # an amount past cents


def test_every_api_answer_rounds_amounts_to_cents_and_quantities_to_six_decimals(tmp_path):
    """Every GET route that needs no path parameter, over samples whose figures are long binary fractions: no
    answer carries a float written with more than six decimals, and no amount carries more than cents."""
    from datetime import timedelta

    from gpuledger.analytics.config import Config
    from gpuledger.analytics.store import Store
    from gpuledger.analytics.windows import utc_now
    from tests.helpers import api_client, gpu_rows, table
    store = Store(tmp_path / "a.duckdb")
    store.set_rates(Config().rates)
    began = (utc_now() - timedelta(hours=20)).replace(microsecond=0)
    rows = [gpu_rows("h", g, "H100", 90, step_s=7.0, start=began, util=33.3 + g / 7, job=f"t{g}/j", team=f"t{g}")
            for g in range(3)]
    store.append_samples(table(*rows))
    store.fold()
    checked = 0
    with api_client(store, Config(), open_reads=True) as client:
        paths = client.get("/openapi.json").json()["paths"]
        for path, operations in paths.items():
            if "get" not in operations or "{" in path or path in ("/v1/backup", "/metrics"):
                continue
            answer = client.get(path)
            if answer.headers.get("content-type", "").startswith("application/json") and answer.status_code == 200:
                checked += 1
                assert not NOISE.search(answer.text), (path, NOISE.search(answer.text).group(0))
                assert not MONEY_NOISE.search(answer.text), (path, MONEY_NOISE.search(answer.text).group(0))
        costs = client.get("/v1/costs").json()
    assert checked >= 20, checked  # the walk reached the routes, not only errors
    assert any(isinstance(v, float) and v != round(v) for v in _floats(costs)), costs  # figures with decimals were seen
    store.close()


def _floats(value):
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _floats(v)
    elif isinstance(value, list):
        for v in value:
            yield from _floats(v)
