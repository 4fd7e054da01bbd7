from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from gpuledger.analytics.config import (DEFAULT_RATES, FAIRSHARE_ALGORITHMS, SECTION_TYPES, SETTINGS, Config,
                                       ConfigError, EfficiencyConfig, FairshareConfig, IngestConfig, LedgerConfig,
                                       PlacementConfig,
                                       QuotaConfig, RetentionConfig, WasteConfig, WhatIfConfig, load_config,
                                       section_keys)


def test_defaults_need_no_file():
    config = load_config(None)
    assert config.rates == DEFAULT_RATES and config.rates["H200"] == 7.91 and config.waste.idle_minutes == 30


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
    assert config.rates["RTX-6000-Ada"] == 1.2  # a rate keyed by the driver's name carries to the card the catalogue names
    assert config.teams["vision"].share == 40 and config.teams["vision"].quota_gpus == 16
    assert config.attributor().team_for(namespace="cv-prod") == "vision"
    assert config.waste.idle_minutes == 60 and config.fairshare.half_life_days == 14


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


def test_each_section_is_a_frozen_dataclass_whose_fields_are_the_file_keys(tmp_path):
    """The file's keys and the attribute names are one list: a section's dataclass fields are exactly the keys
    the loader accepts for it, and every one has a bound."""
    assert SECTION_TYPES == {"waste": WasteConfig, "fairshare": FairshareConfig, "quota": QuotaConfig,
                             "retention": RetentionConfig, "placement": PlacementConfig,
                             "efficiency": EfficiencyConfig, "ledger": LedgerConfig, "whatif": WhatIfConfig,
                             "ingest": IngestConfig}
    config = Config()
    for section, kind in SECTION_TYPES.items():
        names = [f.name for f in fields(kind)]
        assert isinstance(getattr(config, section), kind)
        assert list(section_keys(section)) == names and set(SETTINGS[section]) == set(names), section
        with pytest.raises(AttributeError):  # frozen: a section changes only by replacing it
            setattr(getattr(config, section), names[0], None)
        for name in names:  # the loader refuses a key next to each real one, naming the real one
            path = tmp_path / f"{section}-{name}.toml"
            path.write_text(f"[{section}]\n{name}x = 1\n")
            with pytest.raises(ConfigError, match=rf"\[{section}\] unknown key '{name}x'; did you mean '{name}'"):
                load_config(path)


def _other_value(section: str, name: str, default):
    """A valid value for `[section] name` that differs from its default, as TOML text and as the loader reads it."""
    bound = SETTINGS[section][name]
    if bound.choices:
        value = next(c for c in bound.choices if c != default)
        return f'"{value}"', value
    if bound.names:
        return '["alpha", "beta-2"]', ("alpha", "beta-2")
    value = bound.minimum + 0.5 if bound.maximum is None else (bound.minimum + bound.maximum) / 2
    value = value if value != default else value + 0.25
    return repr(value), value


def test_every_key_of_every_section_round_trips_into_its_attribute(tmp_path):
    lines, want = [], {}
    for section, kind in SECTION_TYPES.items():
        lines.append(f"[{section}]")
        for f in fields(kind):
            text, value = _other_value(section, f.name, f.default)
            lines.append(f"{f.name} = {text}")
            want[section, f.name] = value
    for name, days in (("raw_days", 10.0), ("minute_days", 20.0)):  # raw samples may not outlive minute rollups
        lines[lines.index(f"{name} = 1.5")] = f"{name} = {days}"
        want["retention", name] = days
    path = tmp_path / "all.toml"
    path.write_text("\n".join(lines) + "\n")
    config = load_config(path)
    for (section, name), value in want.items():
        assert getattr(getattr(config, section), name) == value, (section, name)
    assert config.fairshare.algorithm in FAIRSHARE_ALGORITHMS and config.retention.levels().raw_days == 10.0
    default = Config()
    assert all(getattr(getattr(default, s), n) != v for (s, n), v in want.items())  # each key really moved


def test_apps_and_slo_sections_are_checked(tmp_path):
    """[apps] targets need an http(s) url and real pod names; aliases name a known server and figure; an SLO is a
    table of positive seconds: each mistake is one line naming the key."""
    from gpuledger.analytics.config import ConfigError, load_config
    good = tmp_path / "good.toml"
    good.write_text('[apps]\ninterval_s = 10\n[[apps.targets]]\nurl = "http://10.0.0.1:8000/metrics"\n'
                    'namespace = "nlp"\npod = "vllm-0"\n[apps.aliases.vllm]\n"vllm:new_total" = "prompt_tokens"\n'
                    '[slo."meta-llama/Llama-3.1-8B-Instruct"]\nttft_p95_s = 0.25\n')
    config = load_config(good)
    assert config.apps.targets[0].pod == "vllm-0" and config.apps.interval_s == 10
    assert config.slo["meta-llama/Llama-3.1-8B-Instruct"].ttft_p95_s == 0.25
    for body, message in (
            ('[[apps.targets]]\nurl = "file:///etc/passwd"\n', "http"),
            ('[[apps.targets]]\nurl = "http://x/metrics"\npod = "bad pod!"\n', "pod"),
            ('[[apps.targets]]\nurl = "http://x/metrics"\nport = 1\n', "port"),
            ('[apps.aliases.nginx]\n"a" = "requests"\n', "no such server"),
            ('[apps.aliases.vllm]\n"a" = "joules"\n', "no such figure"),
            ('[slo.x]\nttft_p95_s = -1\n', "positive"),
            ('[slo.x]\nttft_p95_s = 0\n', "positive"),
            ('[slo.x]\nlatency = 1\n', "latency"),
            ('[apps]\ninterval_s = 0\n', "interval_s")):
        bad = tmp_path / "bad.toml"
        bad.write_text(body)
        with pytest.raises(ConfigError, match=message):
            load_config(bad)


def test_topology_section_is_checked_as_the_schedulers_crds_would(tmp_path):
    """[topology] levels are Kubernetes label keys, each once, the node's own label only last; name is a Kubernetes
    name; keep_within is one of KEEP_WITHIN and names a level the levels have: each mistake is one line naming it."""
    from gpuledger.analytics.config import KEEP_WITHIN, TopologyConfig
    assert load_config(None).topology == TopologyConfig() and not TopologyConfig().scheduler_objects
    assert TopologyConfig().levels == ("nvidia.com/gpu.clique", "kubernetes.io/hostname")
    assert set(KEEP_WITHIN) == {"island", "node", "clique", "rack"}
    good = tmp_path / "good.toml"
    good.write_text('[topology]\nlevels = ["example.com/rack", "nvidia.com/gpu.clique", "kubernetes.io/hostname"]\n'
                    'name = "dc1-gpus"\nscheduler_objects = true\nrack_label = "example.com/rack"\n'
                    'keep_within = "rack"\n')
    topology = load_config(good).topology
    assert topology == TopologyConfig(("example.com/rack", "nvidia.com/gpu.clique", "kubernetes.io/hostname"),
                                      "dc1-gpus", True, "example.com/rack", "rack")
    assert topology.level_label() == "example.com/rack" and topology.level_label("clique") == "nvidia.com/gpu.clique"
    assert topology.level_label("island") == topology.level_label("node") == "kubernetes.io/hostname"
    for body, message in (
            ('levels = ["nvidia.com/gpu clique"]', "levels: 'nvidia.com/gpu clique' is not a Kubernetes label key"),
            ('levels = ["rack;reboot", "kubernetes.io/hostname"]', "is not a Kubernetes label key"),
            ('levels = ["Example.com/rack"]', "is not a Kubernetes label key"),
            ('levels = "kubernetes.io/hostname"', "levels must be a list"),
            ('levels = []', "levels must be a list of 1 to 16"),
            ('levels = ["kubernetes.io/hostname", "nvidia.com/gpu.clique"]', "can only be the last level"),
            ('levels = ["a", "a"]', "each be named once"),
            ('name = "GPU topology"', "name must be a Kubernetes name"),
            ('scheduler_objects = "yes"', "scheduler_objects must be true or false"),
            ('rack_label = "rack label"', "rack_label must be a Kubernetes label key"),
            ('rack_label = "example.com/rack"', "is not one of levels"),
            ('keep_within = "galaxy"', f"keep_within must be one of {', '.join(KEEP_WITHIN)}, got 'galaxy'"),
            ('keep_within = "rack"', "keep_within = 'rack' needs rack_label"),
            ('levels = ["kubernetes.io/hostname"]\nkeep_within = "clique"', "needs nvidia.com/gpu.clique"),
            ('keep_whithin = "node"', "unknown key 'keep_whithin'; did you mean 'keep_within'")):
        bad = tmp_path / "bad.toml"
        bad.write_text(f"[topology]\n{body}\n")
        with pytest.raises(ConfigError, match=re.escape(message)) as caught:
            load_config(bad)
        assert str(caught.value).startswith("[topology] "), caught.value


def test_the_shipped_example_topology_loads_when_uncommented(tmp_path):
    text = (Path(__file__).resolve().parents[1] / "deploy" / "gpuledger.example.toml").read_text()
    block = text[text.index("# [topology]"):].split("\n\n")[0]
    path = tmp_path / "topology.toml"
    path.write_text("\n".join(line.removeprefix("# ") for line in block.splitlines()) + "\n")
    topology = load_config(path).topology
    assert topology.scheduler_objects and topology.level_label("rack") == topology.rack_label == "example.com/rack"


def test_gpuledger_config_checks_a_file_without_opening_a_database(tmp_path):
    """`gpuledger config FILE`: exit 0 and what it sets, or exit 2 naming the section and key, and no database."""
    import subprocess

    from tests.procs import GPULEDGER
    example = Path(__file__).resolve().parents[1] / "deploy" / "gpuledger.example.toml"
    good = subprocess.run([GPULEDGER, "config", str(example)], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert "valid" in good.stdout and "teams: 2 (nlp, vision)" in good.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[catalogue.X1]\nmemory_gb = 4\n")
    refused = subprocess.run([GPULEDGER, "config", str(bad)], capture_output=True, text=True, timeout=60,
                             cwd=tmp_path)
    assert refused.returncode == 2 and '[catalogue."X1"]' in refused.stderr and "Traceback" not in refused.stderr
    assert not any(tmp_path.rglob("*.duckdb"))
