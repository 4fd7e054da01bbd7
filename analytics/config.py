"""Site configuration: rate card, team shares and quotas, attribution rules, waste thresholds.

Everything has a default so the demo runs with no file; a TOML file overrides any part.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.attribution import Attributor

# USD per GPU-hour, on-demand list prices used as the default rate card.
DEFAULT_RATES: dict[str, float] = {
    "H100": 6.88, "H200": 7.91, "A100-80GB": 3.43, "A100-40GB": 2.75, "L40S": 1.86,
    "L4": 0.80, "A10G": 1.01, "T4": 0.53, "V100": 3.06,
}


class ConfigError(ValueError):
    pass


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


def _number(section: str, key: str, value: Any, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ConfigError(f"[{section}] {key} must be a number >= {minimum}, got {value!r}")
    return float(value)


def load_config(path: str | Path | None) -> Config:
    """Read a TOML config; unknown sections or bad values raise ConfigError naming the key."""
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
    known = {"rates", "teams", "attribution", "waste", "fairshare", "quota"}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {sorted(unknown)}; expected {sorted(known)}")
    for model, rate in data.get("rates", {}).items():
        config.rates[model] = _number("rates", model, rate)
    for team, spec in data.get("teams", {}).items():
        if not isinstance(spec, dict):
            raise ConfigError(f"[teams.{team}] must be a table with share and quota_gpus")
        quota = spec.get("quota_gpus")
        config.teams[team] = TeamConfig(
            share=_number(f"teams.{team}", "share", spec.get("share", 1)),
            quota_gpus=int(_number(f"teams.{team}", "quota_gpus", quota)) if quota is not None else None,
        )
    attribution = data.get("attribution", {})
    config.namespace_to_team.update(attribution.get("namespace_to_team", {}))
    config.user_to_team.update(attribution.get("user_to_team", {}))
    waste = data.get("waste", {})
    config.idle_minutes = _number("waste", "idle_minutes", waste.get("idle_minutes", config.idle_minutes), 1)
    config.idle_util_pct = _number("waste", "idle_util_pct", waste.get("idle_util_pct", config.idle_util_pct))
    config.oversized_mem_fraction = _number(
        "waste", "oversized_mem_fraction", waste.get("oversized_mem_fraction", config.oversized_mem_fraction))
    fairshare = data.get("fairshare", {})
    config.half_life_days = _number("fairshare", "half_life_days",
                                    fairshare.get("half_life_days", config.half_life_days), 0.01)
    quota = data.get("quota", {})
    config.quota_headroom = _number("quota", "headroom", quota.get("headroom", config.quota_headroom))
    return config
