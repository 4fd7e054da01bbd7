from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger.analytics.config import DEFAULT_RATES, ConfigError, load_config


def test_defaults_need_no_file():
    config = load_config(None)
    assert config.rates == DEFAULT_RATES and config.rates["H200"] == 7.91 and config.idle_minutes == 30


def test_file_overrides_rates_teams_and_thresholds(tmp_path):
    path = tmp_path / "gpuledger.toml"
    path.write_text("""
[rates]
H100 = 4.5
"RTX 6000 Ada" = 1.2
[teams.vision]
share = 40
quota_gpus = 16
[attribution]
namespace_to_team = { "cv-prod" = "vision" }
[waste]
idle_minutes = 60
[fairshare]
half_life_days = 14
""")
    config = load_config(path)
    assert config.rates["H100"] == 4.5 and config.rates["RTX 6000 Ada"] == 1.2 and config.rates["L4"] == 0.80
    assert config.teams["vision"].share == 40 and config.teams["vision"].quota_gpus == 16
    assert config.attributor().team_for(namespace="cv-prod") == "vision"
    assert config.idle_minutes == 60 and config.half_life_days == 14


@pytest.mark.parametrize("text, message", [
    ("[rates]\nH100 = -1\n", r"\[rates\] H100 must be a number >= 0"),
    ("[rates]\nH100 = 'cheap'\n", "must be a number"),
    ("[ratez]\nH100 = 1\n", "unknown section"),
    ("[rates\n", "invalid TOML"),
    ("[waste]\nidle_minutes = 0\n", "idle_minutes must be a number >= 1"),
    ("[waste]\nidle_minutez = 60\n", r"\[waste\] unknown key 'idle_minutez'; did you mean 'idle_minutes'"),
    ("[teams.x]\nshare = 1\nquota = 4\n", r"\[teams.x\] unknown key 'quota'; did you mean 'quota_gpus'"),
    ("[attribution]\nnamespaces = {}\n", r"\[attribution\] unknown key 'namespaces'"),
    ("[attribution]\nuser_to_team = { alice = 3 }\n", "values must be team names"),
    ("[fairshare]\nhalf_life = 3\n", "did you mean 'half_life_days'"),
    ("rates = 3\n", r"\[rates\] must be a table"),
])
def test_bad_config_names_the_problem(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_the_shipped_example_config_loads():
    example = Path(__file__).resolve().parents[1] / "deploy" / "gpuledger.example.toml"
    config = load_config(example)
    assert config.teams["vision"].quota_gpus == 14 and config.attributor().team_for(user="alice") == "vision"
