"""Site configuration: rate card, team shares and quotas, attribution rules, thresholds.

Everything has a default so the demo runs with no file; a TOML file overrides any part. The
scalar settings are one declarative table (`SETTINGS`): each key is written once, and a key
that is not in the table is refused with the nearest valid one, so a typo such as
`idle_minutez` cannot silently leave the default in force.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import tomllib

from gpuledger.collector.attribution import Attributor
from gpuledger.collector.errors import GpuledgerError
from gpuledger.collector.gpu_catalog import DEFAULT_RATES


class ConfigError(GpuledgerError, ValueError):
    """The config file is missing, not TOML, or has a key or value gpuledger cannot use."""


@dataclass
class TeamConfig:
    share: float
    quota_gpus: int | None = None


@dataclass
class Config:
    rates: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_RATES))
    teams: dict[str, TeamConfig] = field(default_factory=dict)
    namespace_to_team: dict[str, str] = field(default_factory=dict)
    user_to_team: dict[str, str] = field(default_factory=dict)
    idle_minutes: float = 30.0
    idle_util_pct: float = 5.0
    oversized_mem_fraction: float = 0.25
    half_life_days: float = 7.0
    quota_headroom: float = 0.10

    def attributor(self) -> Attributor:
        return Attributor(namespace_to_team=self.namespace_to_team, user_to_team=self.user_to_team)


@dataclass(frozen=True)
class Setting:
    """One scalar key of the file: where it lives, which Config field it sets, its lower bound."""
    section: str
    key: str
    attr: str
    minimum: float


SETTINGS: tuple[Setting, ...] = (
    Setting("waste", "idle_minutes", "idle_minutes", 1.0),  # an allocated GPU idle this long is waste
    Setting("waste", "idle_util_pct", "idle_util_pct", 0.0),  # "idle" means utilisation under this
    Setting("waste", "oversized_mem_fraction", "oversized_mem_fraction", 0.0),  # peak memory under this share
    Setting("fairshare", "half_life_days", "half_life_days", 0.01),
    Setting("quota", "headroom", "quota_headroom", 0.0),
)
TEAM_KEYS = ("share", "quota_gpus")
ATTRIBUTION_KEYS = ("namespace_to_team", "user_to_team")
SECTIONS = ("rates", "teams", "attribution", *dict.fromkeys(s.section for s in SETTINGS))


def _number(where: str, key: str, value: Any, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ConfigError(f"[{where}] {key} must be a number >= {minimum:g}, got {value!r}")
    return float(value)


def _known_keys(where: str, given: Iterable[str], known: Iterable[str]) -> None:
    """Refuse keys outside `known`, naming the nearest valid one."""
    known = list(known)
    for key in given:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ConfigError(f"[{where}] unknown key {key!r}; {hint}(valid: {', '.join(known)})")


def _table(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"[{where}] must be a table, got {value!r}")
    return value


def _names(where: str, value: Any) -> dict[str, str]:
    """A table of name -> team (attribution maps)."""
    table = _table(where, value)
    bad = {k: v for k, v in table.items() if not isinstance(v, str) or not v}
    if bad:
        raise ConfigError(f"[{where}] values must be team names, got {bad!r}")
    return dict(table)


def load_config(path: str | Path | None) -> Config:
    """Read a TOML config; unknown sections or keys and bad values raise ConfigError naming the key."""
    config = Config()
    if path is None:
        return config
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {unknown}; expected {sorted(SECTIONS)}")
    for model, rate in _table("rates", data.get("rates", {})).items():
        config.rates[model] = _number("rates", model, rate)
    for team, spec in _table("teams", data.get("teams", {})).items():
        where = f"teams.{team}"
        if not isinstance(spec, dict):
            raise ConfigError(f"[{where}] must be a table with share and quota_gpus")
        _known_keys(where, spec, TEAM_KEYS)
        quota = spec.get("quota_gpus")
        config.teams[team] = TeamConfig(
            share=_number(where, "share", spec.get("share", 1)),
            quota_gpus=int(_number(where, "quota_gpus", quota)) if quota is not None else None,
        )
    attribution = _table("attribution", data.get("attribution", {}))
    _known_keys("attribution", attribution, ATTRIBUTION_KEYS)
    for key in ATTRIBUTION_KEYS:
        getattr(config, key).update(_names(f"attribution.{key}", attribution.get(key, {})))
    for section in dict.fromkeys(s.section for s in SETTINGS):
        values = _table(section, data.get(section, {}))
        settings = [s for s in SETTINGS if s.section == section]
        _known_keys(section, values, [s.key for s in settings])
        for setting in settings:
            if setting.key in values:
                setattr(config, setting.attr, _number(section, setting.key, values[setting.key], setting.minimum))
    return config
