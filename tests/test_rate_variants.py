"""Rates per node pool and per MIG profile: two pools of one GPU model cost differently (pools from node-name globs
or from the node labels kube-state-metrics reports), a MIG slice is priced at its profile's instance rate, the most
specific rate in force wins, every bill names the rate that priced it, bills add up to the cent, and a closed
period keeps its figures when pools or pool rates change."""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from gpuledger.analytics.config import Config, ConfigError, LedgerConfig, load_config
from gpuledger.analytics.cost import cost_by_team, cost_by_team_and_model
from gpuledger.analytics.focus_export import focus_rows
from gpuledger.analytics.ledger import close_due, statement
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.rates import ClosedPeriodError
from gpuledger.collector.jobs.kube_state import parse_kube_state
from gpuledger.collector.samples import IDLE_CAPACITY
from tests.helpers import api_client, gpu_rows, table

UTC = timezone.utc
START = datetime(2026, 11, 20, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)
AFTER_GRACE = datetime(2026, 12, 5, tzinfo=UTC)
H100 = Config().rates["H100"]
SITE = """
[node_pools]
labels = ["cloud.google.com/gke-nodepool"]
[node_pools.nodes]
spot = ["spot-*"]
[pool_rates.spot]
H100 = 1.5
[pool_rates.a3-reserved]
H100 = 2.5
[profile_rates.A100-80GB]
"1g.10gb" = 0.7
"""
# kube-state-metrics' node labels for the labelled node, as its /metrics page writes them (a hostile value beside)
NODE_PAGE = """# HELP kube_node_labels Kubernetes labels converted to Prometheus labels.
# TYPE kube_node_labels gauge
kube_node_labels{node="gke-a3-1",label_cloud_google_com_gke_nodepool="a3-reserved",label_zone="us-c1"} 1
kube_node_labels{node="gke-a3-2",label_cloud_google_com_gke_nodepool="$(reboot)"} 1
"""


def _load(tmp_path, text: str) -> Config:
    path = tmp_path / "site.toml"
    path.write_text(text)
    return load_config(path)


def _fill(store: Store, config: Config, hours: int = 240) -> Store:
    """One busy H100 per node (a spot node, a labelled node, a node in no pool), one free H100 on the spot node, and
    an A100-80GB whose 1g.10gb slice a job holds (the rest of the card idle), sampled every 10 minutes."""
    config.price(store)
    batch = parse_kube_state(NODE_PAGE)
    assert batch.skipped["bad_node_label"] == 1  # the hostile value is not a pool
    store.set_node_labels(batch.node_labels, START)
    minutes = hours * 60
    slice_rows = gpu_rows("plain-1", 1, "A100-80GB", minutes, step_s=600, start=START, util=60.0, job="m/1",
                          team="mig", mig_profile="1g.10gb", mig_instance=7, gpu_fraction=1 / 7)
    rest = gpu_rows("plain-1", 1, "A100-80GB", minutes, step_s=600, start=START, gpu_fraction=6 / 7)
    for row in slice_rows:
        row["gpu_uuid"] = "MIG-plain-1-1-7"
    store.append_samples(table(
        gpu_rows("spot-1", 0, "H100", minutes, step_s=600, start=START, util=50.0, job="a/1", team="a"),
        gpu_rows("spot-1", 1, "H100", minutes, step_s=600, start=START),
        gpu_rows("gke-a3-1", 0, "H100", minutes, step_s=600, start=START, util=50.0, job="b/1", team="b"),
        gpu_rows("plain-1", 0, "H100", minutes, step_s=600, start=START, util=50.0, job="c/1", team="c"),
        slice_rows, rest))
    store.fold()
    return store


def _cents(value) -> int:
    return int(Decimal(str(value)).scaleb(2))


def test_pools_and_mig_profiles_price_their_own_hours_and_every_bill_names_the_rate(file_store, tmp_path, stack):
    config = _load(tmp_path, SITE)
    store = _fill(file_store, config)
    hours = 240
    lines = cost_by_team_and_model(store, START, START + timedelta(hours=hours)).set_index("team")
    assert lines.loc["a", "cost_usd"] == pytest.approx(hours * 1.5)  # spot-1 matches the glob
    assert lines.loc["a", "rate_card"] == "[rates] (pool spot)"
    assert lines.loc["b", "cost_usd"] == pytest.approx(hours * 2.5)  # gke-a3-1's node label names its pool
    assert lines.loc["b", "rate_card"] == "[rates] (pool a3-reserved)"
    assert lines.loc["c", "cost_usd"] == pytest.approx(hours * H100)  # in no pool: the model's own rate
    assert lines.loc["c", "rate_card"] == "[rates]"
    # the slice: 240 instance-hours at $0.70, held as 1/7 of a card at $4.90 per GPU-hour
    assert lines.loc["mig", "gpu_hours"] == pytest.approx(hours / 7)
    assert lines.loc["mig", "cost_usd"] == pytest.approx(hours * 0.7)
    assert lines.loc["mig", "rate_card"] == "[rates] (profile 1g.10gb)"
    by_team = cost_by_team(store, START, START + timedelta(hours=hours)).set_index("team")
    # idle capacity: the free spot H100 at the spot rate, and 6/7 of the A100 at its model's rate
    idle = hours * 1.5 + hours * 6 / 7 * Config().rates["A100-80GB"]
    assert by_team.loc[IDLE_CAPACITY, "cost_usd"] == pytest.approx(idle)
    pools = store.node_pools().set_index("node")["pool"].to_dict()
    assert pools["spot-1"] == "spot" and pools["gke-a3-1"] == "a3-reserved"
    assert pools["plain-1"] != pools["plain-1"]  # NaN: in no pool
    # the statement adds up to the cent and its lines and FOCUS rows carry the variant's rate card
    ledger = LedgerConfig()
    close_due(store, ledger, AFTER_GRACE)
    found = statement(store, ledger, "2026-11", AFTER_GRACE)
    assert _cents(found["total_usd"]) == sum(_cents(r["cost_usd"]) for r in found["lines"])
    assert {r["rate_card"] for r in found["lines"]} >= {"[rates] (pool spot)", "[rates] (profile 1g.10gb)"}
    rows = focus_rows(found)
    assert "[rates] (pool a3-reserved)" in set(rows["x_RateCard"])
    client = stack.enter_context(api_client(store, config, open_reads=True))
    history = client.get("/v1/rates").json()
    assert any(r.get("variant") == "profile 1g.10gb" and "0.7/instance-hour" in (r.get("basis") or "")
               for r in history), history


def test_a_closed_period_keeps_its_figures_when_pools_or_pool_rates_change(file_store, tmp_path):
    config = _load(tmp_path, SITE)
    store = _fill(file_store, config, hours=14 * 24)  # Nov 20 - Dec 4
    ledger = LedgerConfig()
    close_due(store, ledger, AFTER_GRACE)
    before = statement(store, ledger, "2026-11", AFTER_GRACE)
    moved = _load(tmp_path, SITE.replace('spot = ["spot-*"]', 'spot = ["nothing-*"]'))
    with pytest.raises(ClosedPeriodError, match=r"node pools .* changed.*pool rates priced closed time"):
        moved.price(store)
    repriced = _load(tmp_path, SITE.replace("H100 = 1.5", "H100 = 1.0"))
    with pytest.raises(ClosedPeriodError, match=r"H100 \(pool spot\) from 2026-11-01 00:00 UTC: \$1.5/GPU-hour -> "
                                                r"\$1/GPU-hour"):
        repriced.price(store)
    dated = _load(tmp_path, SITE + '[[rate_cards]]\nfrom = 2026-12-02\npools = { spot = { H100 = 1.0 } }\n')
    dated.price(store)  # dated after the close: accepted, and prices only later hours
    assert statement(store, ledger, "2026-11", AFTER_GRACE) == before
    lines = cost_by_team_and_model(store, DEC + timedelta(days=1), DEC + timedelta(days=2), "a")
    assert set(lines["rate_card"]) == {"from 2026-12-02 00:00 UTC (pool spot)"}
    assert lines["cost_usd"].sum() == pytest.approx(24 * 1.0)


@pytest.mark.parametrize("text, message", [
    ("[pool_rates.gpu-a]\nH100 = 1\n", "no node is in that pool"),
    ("[node_pools.nodes]\nspot = [\"spot-*\"]\n[pool_rates.spot]\nH100 = -1\n", "must be a number >= 0"),
    ("[node_pools.nodes]\nspot = [\"spot-$(id)\"]\n", "node-name globs"),
    ("[node_pools.nodes]\n\"sp ot\" = [\"spot-*\"]\n", "not a valid node pool name"),
    ("[node_pools]\nlabels = [\"bad label\"]\n", "Kubernetes label keys"),
    ("[node_pools]\nregion = \"x\"\n", "unknown key 'region'"),
    ("[profile_rates.H100]\n\"1g.5gb\" = 0.5\n", "not a MIG or vGPU profile of H100"),
    ("[profile_rates.L4]\n\"1g.5gb\" = 0.5\n", "not a MIG or vGPU profile of L4"),
    ("[profile_rates.H100]\n\"1g.10gb\" = 0.5\n[[rate_cards]]\nfrom = 2026-12-01\n"
     "profiles = { H100 = { \"9g.99gb\" = 1 } }\n", "not a MIG or vGPU profile"),
    ("[node_pools.nodes]\nspot = [\"spot-*\"]\n[pool_rates.spot]\nH100 = 1\n[cost_models.H100.pools.spot]\n"
     "kind = \"cloud\"\ngpus_per_instance = 8\non_demand_usd_per_hour = 80\n", "both set H100's rate in pool spot"),
])
def test_bad_pool_and_profile_rates_are_refused_at_load(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, text)


def test_a_pool_cost_model_gives_that_pool_its_own_rate(tmp_path):
    config = _load(tmp_path, """
[node_pools.nodes]
spot = ["spot-*"]
[cost_models.H100]
kind = "cloud"
instance_type = "p5.48xlarge"
gpus_per_instance = 8
on_demand_usd_per_hour = 98.32
[cost_models.H100.pools.spot]
kind = "cloud"
instance_type = "p5.48xlarge"
gpus_per_instance = 8
pricing = "spot"
spot_usd_per_hour = 40.0
""")
    assert config.rates["H100"] == pytest.approx(98.32 / 8)
    assert config.variant_rates[("H100", "pool spot")] == pytest.approx(5.0)
    assert "spot $40.0000/h / 8 GPUs" in config.rate_basis[("H100", None, "pool spot")]


def test_the_docs_worked_example_of_pool_and_profile_rates_gives_the_rates_it_states(tmp_path):
    page = (Path(__file__).resolve().parents[1] / "docs" / "howto" / "ledger.md").read_text()
    section = page[page.index("## Rates per node pool and MIG profile"):]
    block = re.search(r"```toml\n(.*?)```\nResult: (.*?)\n\n", section, re.S)
    config = _load(tmp_path, block.group(1))
    pool, profile = (float(x) for x in re.findall(r"\*\*\$([0-9.]+) per GPU-hour\*\*", block.group(2)))
    assert round(config.variant_rates[("H100", "pool spot")], 4) == pool == 3.00
    assert round(config.variant_rates[("A100-80GB", "profile 1g.10gb")], 4) == profile == 4.90
    assert config.node_pools == [(None, None, "label_cloud_google_com_gke_nodepool"), ("spot", "gpu-spot-*", None)]


def test_a_vgpu_guest_is_priced_at_its_profiles_rate_and_other_guests_at_their_cards_share(file_store, tmp_path):
    config = _load(tmp_path, '[profile_rates.A100-40GB]\n"A100-10C" = 0.9\n')
    assert config.variant_rates[("A100-40GB", "profile a100-10c")] == pytest.approx(0.9 / 0.25)
    config.price(file_store)
    file_store.append_samples(table(
        gpu_rows("vm-1", 0, "A100-40GB", 600, step_s=600, start=START, util=50.0, job="v/1", team="v",
                 model_name="GRID A100-10C", gpu_fraction=0.25),
        gpu_rows("vm-2", 0, "A100-40GB", 600, step_s=600, start=START, util=50.0, job="w/1", team="w",
                 model_name="NVIDIA A100-20C", gpu_fraction=0.5)))
    file_store.fold()
    lines = cost_by_team_and_model(file_store, START, START + timedelta(hours=10)).set_index("team")
    assert lines.loc["v", "cost_usd"] == pytest.approx(10 * 0.9)  # 10 instance-hours at $0.90
    assert lines.loc["v", "rate_card"] == "[rates] (profile a100-10c)"
    assert lines.loc["w", "cost_usd"] == pytest.approx(10 * 0.5 * Config().rates["A100-40GB"])  # its card's share
    assert lines.loc["w", "rate_card"] == "[rates]"
    profiles = file_store.query("SELECT DISTINCT vgpu_profile FROM usage_minute ORDER BY 1")["vgpu_profile"].tolist()
    assert profiles == ["A100-10C", "A100-20C"]
