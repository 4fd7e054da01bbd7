"""Cost models that produce rates (on-premises, cloud), each worked example of the docs (docs/howto/ledger.md) reproduced, and energy
per team and job from the samples' power readings."""
from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from gpuledger.analytics.config import Config, ConfigError, load_config
from gpuledger.analytics.energy import energy
from tests.helpers import T0, api_client, gpu_rows, table

# the how-to page whose worked examples are checked here (the docs site: docs/mkdocs.yml)
LEDGER_PAGE = Path(__file__).resolve().parents[1] / "docs" / "howto" / "ledger.md"
EXAMPLE = re.compile(r"```toml\n(\[cost_models\.[^\n]+\n.*?)```\nResult: \*\*\$([0-9.]+) per GPU-hour\*\*", re.S)


def _load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "site.toml"
    path.write_text(text)
    return load_config(path)


def test_each_worked_example_of_the_docs_gives_the_rate_it_states(tmp_path):
    examples = EXAMPLE.findall(LEDGER_PAGE.read_text())
    assert len(examples) == 2  # on-premises and cloud
    for text, stated in examples:
        config = _load(tmp_path, text)
        (derived,) = config.cost_models
        assert round(derived.model.rate(), 4) == pytest.approx(float(stated)), text
        rate = (config.rates if derived.start is None else config.rate_cards[0].rates)[derived.gpu_model]
        assert rate == pytest.approx(derived.model.rate())
    on_prem = _load(tmp_path, examples[0][0]).cost_models[0].model
    assert {k: round(v, 4) for k, v in on_prem.parts().items()} == {
        "amortisation": 0.9126, "power": 0.1428, "overhead": 0.1369}


def test_cloud_pricing_options_and_a_dated_model_reach_the_card_with_their_workings(file_store, tmp_path):
    base = ('[cost_models.H200]\nkind = "cloud"\ninstance_type = "p5en.48xlarge"\ngpus_per_instance = 8\n'
            'on_demand_usd_per_hour = 84.80\nreserved_usd_per_hour = 55.12\nspot_usd_per_hour = 30.00\n')
    for pricing, rate in (("on_demand", 10.60), ("reserved", 6.89), ("spot", 3.75)):
        config = _load(tmp_path, base + f'pricing = "{pricing}"\n')
        assert config.rates["H200"] == pytest.approx(rate)
    dated = _load(tmp_path, base + 'pricing = "reserved"\nfrom = 2026-12-01\n')
    dated.price(file_store)
    history = file_store.rate_history().set_index(["gpu_model", "rate_card"])
    assert history.loc[("H200", "[rates]"), "usd_per_gpu_hour"] == Config().rates["H200"]  # before the contract
    basis = history.loc[("H200", "from 2026-12-01 00:00 UTC"), "basis"]
    assert basis == "cloud: p5en.48xlarge reserved $55.1200/h / 8 GPUs = $6.8900/GPU-hour"
    with api_client(file_store, dated, open_reads=True) as api:
        shown = api.get("/v1/rates").json()
    assert {r["basis"] for r in shown if r["gpu_model"] == "H200"} == {None, basis}


def test_a_cost_model_that_cannot_price_is_refused_at_load(tmp_path):
    for text, message in [
        ('[cost_models.H100]\nkind = "lease"\n', "kind must be one of on_prem, cloud"),
        ('[cost_models.H100]\nkind = "on_prem"\npurchase_usd = 1\n', "needs life_years, power_w"),
        ('[cost_models.H100]\nkind = "on_prem"\npurchase_usd = 1\nlife_years = 4\npower_w = 700\npue = 0.5\n',
         "pue must be a number >= 1"),
        ('[cost_models.H100]\nkind = "on_prem"\npurchase_usd = 1\nlife_years = 4\npower_w = 700\npower = 1\n',
         "unknown key 'power'"),
        ('[cost_models.H100]\nkind = "cloud"\ngpus_per_instance = 8\npricing = "spot"\n'
         'on_demand_usd_per_hour = 10\n', "spot_usd_per_hour is not given"),
        ('[rates]\nH100 = 5\n[cost_models.H100]\nkind = "cloud"\ngpus_per_instance = 8\non_demand_usd_per_hour = 10\n',
         "both set H100's rate"),
        ('[cost_models.H100]\nkind = "cloud"\ngpus_per_instance = 8\non_demand_usd_per_hour = -1\n', ">= 0"),
    ]:
        with pytest.raises(ConfigError, match=message):
            _load(tmp_path, text)


def test_energy_per_team_and_job_counts_only_what_was_read(file_store):
    store = file_store
    store.append_samples(table(
        gpu_rows("n1", 0, "H100", 60, util=80.0, job="a/1", team="a", power_w=700.0),  # 0.7 kWh
        gpu_rows("n1", 1, "H100", 60, util=80.0, job="a/1", team="a"),  # no power reading
        gpu_rows("n2", 0, "A100-80GB", 120, util=50.0, job="b/1", team="b", power_w=350.0,
                 gpu_fraction=3 / 7, mig_profile="3g.40gb", mig_instance=1),  # 2 h x 350 W x 3/7 = 0.3 kWh
        gpu_rows("n3", 0, "L4", 60, util=50.0, job="c/1", team="c"),  # never read: no figure
    ))
    teams, jobs = energy(store, T0, T0 + timedelta(days=1), pue=1.4)
    teams = teams.set_index("team")
    assert teams.loc["a", "gpu_kwh"] == pytest.approx(0.7) and teams.loc["a", "power_coverage"] == pytest.approx(0.5)
    assert teams.loc["b", "gpu_kwh"] == pytest.approx(0.3) and teams.loc["b", "facility_kwh"] == pytest.approx(0.42)
    assert teams["gpu_kwh"].isna()["c"] and teams.loc["c", "power_coverage"] == 0.0
    jobs = energy(store, T0, T0 + timedelta(days=1))[1].set_index("job_id")
    assert jobs.loc["a/1", "gpu_kwh"] == pytest.approx(0.7)
    assert jobs.loc["c/1", "power_coverage"] == 0.0 and pd.isna(jobs.loc["c/1", "gpu_kwh"])
    assert energy(store, T0, T0 + timedelta(days=1))[0]["facility_kwh"].isna().all()  # no PUE given: none
    with api_client(store, Config(), open_reads=True) as api:
        answer = api.get("/v1/energy", params={"days": 30, "end": (T0 + timedelta(days=1)).isoformat()}).json()
    assert {t["team"]: t["gpu_kwh"] for t in answer["teams"]}["c"] is None
    assert answer["complete_from"].startswith("2026-11-02")
