"""The GPU catalogue is the one place models live: names, MIG geometry, memory, default rates, simulator specs."""
from __future__ import annotations

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
    ("NVIDIA L40S", "L40S"), ("Tesla V100-SXM2-16GB", "V100"), ("NVIDIA RTX A5000", "NVIDIA RTX A5000"),
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


@pytest.mark.parametrize("model", [m for m in CATALOG if m.mig_slices], ids=lambda m: m.name)
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
