"""The GPU catalogue is the one place models live: names, MIG geometry, memory, default rates, simulator specs."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from gpuledger.analytics.config import Config
from gpuledger.analytics.waste import smallest_fit
from gpuledger.collector.gpu_catalog import (
    CATALOG,
    DEFAULT_RATES,
    MODELS,
    UNKNOWN_MODEL,
    mig_fraction,
    mig_memory_gb,
    normalize_model,
)
from gpuledger.collector.simulator import DEFAULT_NODES


@pytest.mark.parametrize("reported, model", [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A100 80GB PCIe", "A100-80GB"), ("NVIDIA A100-PCIE-40GB", "A100-40GB"), ("NVIDIA A30", "A30"),
    ("NVIDIA B200", "B200"), ("NVIDIA GB200", "GB200"), ("Tesla T4", "T4"), ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"), ("Tesla V100-SXM2-16GB", "V100"), ("NVIDIA RTX A5000", "RTX-A5000"),
    ("NVIDIA TITAN V", "NVIDIA TITAN V"),  # older than three generations: its raw name, unpriced
    # the list: each as its driver names it
    ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA GH200 96GB HBM3", "GH200"), ("NVIDIA GH200 144G HBM3e", "GH200-144GB"),
    ("NVIDIA GB300", "GB300"),
    ("NVIDIA B300 SXM6 AC", "B300"), ("NVIDIA H20", "H20"), ("NVIDIA H100 PCIe", "H100-PCIE"),
    ("NVIDIA H100 NVL", "H100-NVL"), ("NVIDIA H200 NVL", "H200-NVL"), ("NVIDIA H800", "H800"), ("NVIDIA L40", "L40"),
    ("NVIDIA A40", "A40"), ("NVIDIA A10", "A10"), ("NVIDIA A10G", "A10G"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000"),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX-PRO-6000"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"), ("NVIDIA RTX 4000 Ada Generation", "RTX-4000-Ada"),
    ("NVIDIA RTX 4000 SFF Ada Generation", "RTX-4000-SFF-Ada"), ("NVIDIA RTX A6000", "RTX-A6000"),
    (None, UNKNOWN_MODEL), ("", UNKNOWN_MODEL),
])
def test_driver_names_normalise_to_catalogue_models(reported, model):
    assert normalize_model(reported) == model


def test_mig_fractions_follow_each_cards_geometry():
    assert mig_fraction("H100", "3g.40gb") == pytest.approx(3 / 7)
    assert mig_fraction("A30", "1g.6gb") == pytest.approx(1 / 4)  # four compute slices, not seven
    assert mig_fraction("A30", "2g.12gb") == pytest.approx(1 / 2)
    assert mig_fraction("H100", None) == 1.0 and mig_fraction("H100", "garbage") == 1.0
    assert mig_memory_gb("1g.10gb") == 10 and mig_memory_gb("whole") is None


@pytest.mark.parametrize("model", [m for m in CATALOG if m.mig_profiles], ids=lambda m: m.name)
def test_every_profile_fits_its_card(model):
    for profile in model.mig_profiles:
        assert 1 <= profile.compute_slices <= model.mig_slices
        assert profile.memory_gb <= model.memory_gb
        assert profile.name.startswith(f"{profile.compute_slices}g.{profile.memory_gb}gb")
        assert 0 < mig_fraction(model.name, profile.name) <= 1.0
    assert max(p.compute_slices for p in model.mig_profiles) == model.mig_slices


def test_rates_and_simulator_are_derived_from_the_catalogue():
    assert DEFAULT_RATES == {m.name: m.usd_per_gpu_hour for m in CATALOG if m.usd_per_gpu_hour is not None}
    assert Config().rates == DEFAULT_RATES and DEFAULT_RATES["H100"] == 6.88
    assert "B200" not in DEFAULT_RATES  # no list price known: reported as unpriced, never guessed
    for node in DEFAULT_NODES:
        assert node.model in MODELS and normalize_model(node.model_name) == node.model
        assert node.mem_mib == MODELS[node.model].mem_mib


def test_fit_advice_uses_the_cards_own_profiles():
    assert smallest_fit("A30", 3000, 20)["target"] == "A30 MIG 1g.6gb"
    assert smallest_fit("A30", 3000, 20)["gpu_fraction"] == pytest.approx(0.25)
    assert smallest_fit("H200", 12000, 10)["target"] == "H200 MIG 1g.18gb"
    assert smallest_fit("H100", 60000, 90) is None  # a whole-card profile (7g) is no saving


def test_every_card_names_itself_and_no_card_takes_another_cards_driver_name():
    """Each shipped card's own driver name resolves to that card, not to one listed before it (a variant listed
    after its base card would never be named), and each card with a MIG geometry lists profiles or says why not."""
    for card in CATALOG:
        assert normalize_model(card.driver_name) == card.name, card
        assert card.mem_mib <= card.memory_gb * 1024 * 1.01
        assert (card.usd_per_gpu_hour is None) == (card.price_basis is None), card.name


SHARED_PAGE = Path(__file__).resolve().parent.parent.parent / "shared" / "dcgm-pages" / \
    "dcgm-exporter-issue-363-rtxa5000.txt"
NEW_CARD = "NVIDIA RTX PRO 9000 Blackwell"  # a card no release knows
SITE_CARD = """
[catalogue."RTX-PRO-9000"]
patterns = ['\\bRTX PRO 9000\\b']
memory_gb = 192
mig_slices = 4
mig_profiles = ["1g.48gb", "2g.96gb", "4g.192gb"]
{rate}
"""


def _bill(tmp_path, name: str, config_text: str | None):
    """A real page (its card renamed to NEW_CARD) scraped every 10 s for 20 minutes into a store priced by the
    config: (the config, the costs per team and model over that time, GET /v1/catalogue's answer)."""
    from gpuledger.analytics.config import load_config
    from gpuledger.analytics.cost import cost_by_team_and_model
    from gpuledger.analytics.store import Store
    from gpuledger.analytics.windows import utc_now
    from gpuledger.collector.dcgm_source import DcgmPageConverter
    from tests.helpers import api_client
    path = None
    if config_text is not None:
        path = tmp_path / f"{name}.toml"
        path.write_text(config_text)
    config = load_config(path)
    # a pod holds the GPU (the page's exporter was not told of pods): the bill names the card of an allocation
    page = SHARED_PAGE.read_text().replace('modelName="NVIDIA RTX A5000"',
                                           f'modelName="{NEW_CARD}",namespace="nlp",pod="train-0"')
    end = utc_now().replace(second=0, microsecond=0)
    start = end - timedelta(minutes=20)
    store = Store(tmp_path / f"{name}.duckdb")
    try:
        config.price(store)
        for i in range(120):
            store.append_samples(DcgmPageConverter().convert(page, start + timedelta(seconds=10 * i), 10.0))
        store.fold()
        costs = cost_by_team_and_model(store, start, end)
        with api_client(store, config, token="admin-token") as client:
            assert client.get("/v1/catalogue").status_code == 401  # a read like any other: a token first
            answer = client.get("/v1/catalogue", headers={"Authorization": "Bearer admin-token"})
            assert answer.status_code == 200, answer.text
        return config, costs, answer.json()
    finally:
        store.close()
        load_config(None)  # the shipped catalogue again for the next test of this process


def test_a_card_the_site_adds_is_named_priced_and_shown_without_code(tmp_path):
    # unknown to gpuledger: the driver's name is the model, nothing is billed, and the catalogue route says why
    _, costs, shown = _bill(tmp_path, "unknown", None)
    assert set(costs["gpu_model"]) == {NEW_CARD}
    assert costs["usd_per_gpu_hour"].isna().all() and costs["cost_usd"].fillna(0).sum() == 0
    present = {m["gpu_model"]: m for m in shown["present"]}
    assert not present[NEW_CARD]["catalogued"] and present[NEW_CARD]["rate_status"].startswith("unpriced")
    assert NEW_CARD not in {c["name"] for c in shown["cards"]}

    # named by the site without a rate: its own name, MIG geometry and memory, still unpriced (never guessed)
    config, costs, shown = _bill(tmp_path, "named", SITE_CARD.format(rate=""))
    assert set(costs["gpu_model"]) == {"RTX-PRO-9000"} and costs["usd_per_gpu_hour"].isna().all()
    card = next(c for c in shown["cards"] if c["name"] == "RTX-PRO-9000")
    assert card["source"] == "site" and card["memory_gb"] == 192 and card["mig_profiles"] == [
        "1g.48gb", "2g.96gb", "4g.192gb"] and card["usd_per_gpu_hour"] is None
    assert card["rate_status"].startswith("unpriced")

    # and with a rate: billed at it, to the cent of GPU-hours times rate
    config, costs, shown = _bill(tmp_path, "priced", SITE_CARD.format(rate="usd_per_gpu_hour = 2.5"))
    assert config.rates["RTX-PRO-9000"] == 2.5
    assert set(costs["gpu_model"]) == {"RTX-PRO-9000"} and (costs["usd_per_gpu_hour"] == 2.5).all()
    assert costs["cost_usd"].sum() == pytest.approx(costs["gpu_hours"].sum() * 2.5, abs=0.01)
    assert costs["gpu_hours"].sum() == pytest.approx(20 / 60, rel=0.02)  # one GPU for 20 minutes
    present = {m["gpu_model"]: m for m in shown["present"]}
    assert present["RTX-PRO-9000"] == {"gpu_model": "RTX-PRO-9000", "gpus": 1.0, "catalogued": True,
                                       "usd_per_gpu_hour": 2.5, "rate_status": "priced"}


def test_a_site_changes_a_shipped_card_key_by_key():
    from gpuledger.analytics.config import load_config
    from gpuledger.collector.gpu_catalog import mig_fraction
    path = Path(__file__).parent / "data" / "catalogue_override.toml"
    try:
        config = load_config(path)
        card = MODELS["GB300"]
        assert card.source == "site" and card.memory_gb == 288 and card.nvlink  # kept from the shipped entry
        assert [p.name for p in card.mig_profiles] == ["1g.34gb", "7g.270gb"]
        assert mig_fraction("GB300", "1g.34gb") == pytest.approx(1 / 7)
        assert "GB300" not in config.rates  # no list price shipped, none given: unpriced
    finally:
        load_config(None)
    assert MODELS["GB300"].source == "built-in" and not MODELS["GB300"].mig_profiles


@pytest.mark.parametrize("table, message", [
    ("[catalogue.X1]\nmemory_gb = 10", "needs patterns"),
    ("[catalogue.X1]\npatterns = ['(unclosed']\nmemory_gb = 10", "is not a regular expression"),
    ("[catalogue.X1]\npatterns = ['x1']\nmemory_gb = -4", "memory_gb must be a number"),
    ("[catalogue.X1]\npatterns = ['x1']\nmemory_gb = nan", "memory_gb must be a number"),
    ("[catalogue.X1]\npatterns = ['x1']\nmemory_gb = 10\nmig_profiles = ['3g.40gb']", "does not fit"),
    ("[catalogue.X1]\npatterns = ['x1']\nmemory_gb = 10\nmig_profiles = ['big']", "not a MIG profile name"),
    ("[catalogue.X1]\npatterns = ['x1']\nmemory_gb = 10\nspeed = 3", "unknown key"),
    ('[catalogue."<b>"]\npatterns = [\'x1\']\nmemory_gb = 10', "not a valid GPU model"),
    ("[catalogue.X1]\npatterns = ['" + "a" * 201 + "']\nmemory_gb = 10", "each pattern must be"),
])
def test_a_bad_card_is_refused_naming_its_table_and_key(tmp_path, table, message):
    from gpuledger.analytics.config import ConfigError, load_config
    path = tmp_path / "site.toml"
    path.write_text(table + "\n")
    try:
        with pytest.raises(ConfigError, match=message):
            load_config(path)
    finally:
        load_config(None)


def test_a_site_pattern_that_takes_shipped_cards_is_said(tmp_path, caplog):
    from gpuledger.analytics.config import load_config
    path = tmp_path / "broad.toml"
    path.write_text("[catalogue.ANY]\npatterns = ['.*']\nmemory_gb = 16\n")
    try:
        with caplog.at_level("WARNING"):
            load_config(path)
        assert normalize_model("NVIDIA H100 80GB HBM3") == "ANY"  # what the site asked for, and said
        assert "H100" in caplog.text and "will be named ANY" in caplog.text
    finally:
        load_config(None)
