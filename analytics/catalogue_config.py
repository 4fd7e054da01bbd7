"""A site's own GPU cards: the config's `[catalogue."NAME"]` tables, each a card the shipped catalogue
(collector/gpu_catalogue.toml) lacks, or keys that change a shipped card (a MIG profile list, a list price).

Why in the config and not in code: new cards ship every few months, and a site meets one before a release knows
it; until it is named, its samples carry the driver's raw name and bill nothing (reported unpriced). A table here
gives it a name, memory, MIG geometry and NVLink for the advice, and optionally a rate, without a release.
"""
from __future__ import annotations

import logging
import math
import re
from dataclasses import asdict
from typing import Any, Mapping

from gpuledger.collector.errors import InputError
from gpuledger.collector.gpu_catalog import (CATALOG, ENTRY_KEYS, MODELS, SITE, GpuModel, model_from_entry,
                                            normalize_model)
from gpuledger.collector.identifiers import check_identifier

log = logging.getLogger(__name__)
MAX_CARDS = 200  # tables in [catalogue]
MAX_PATTERNS = 10  # patterns per card
MAX_PATTERN_CHARS = 200
# key -> (smallest, largest) for the numbers
NUMBERS = {"memory_gb": (1, 4096), "tdp_w": (1, 5000), "mem_mib": (1, 4096 * 1024), "usd_per_gpu_hour": (0, 1000),
           "mig_slices": (0, 8), "nvlink_gbytes_s": (1, 100_000)}
TEXTS = {"driver_name": 128, "price_basis": 200}


def site_catalogue(section: Any) -> list[GpuModel]:
    """The cards of a `[catalogue]` section, checked: every key known, numbers in bounds, patterns that compile,
    MIG profiles that fit the card. Raises ValueError naming the table and key."""
    if not isinstance(section, Mapping):
        raise ValueError(f"[catalogue] must be a table of cards, got {section!r}")
    if len(section) > MAX_CARDS:
        raise ValueError(f"[catalogue] holds {len(section)} cards; at most {MAX_CARDS}")
    shipped = {m.name: m for m in CATALOG}
    return [_card(name, spec, shipped.get(name)) for name, spec in section.items()]


def _card(name: str, spec: Any, shipped: GpuModel | None) -> GpuModel:
    where = f'[catalogue."{name}"]'
    try:
        check_identifier("gpu_model", name, "[catalogue]")
    except InputError as exc:
        raise ValueError(str(exc)) from exc
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where} must be a table with patterns and memory_gb")
    unknown = sorted(set(spec) - set(ENTRY_KEYS))
    if unknown:
        raise ValueError(f"{where} unknown key(s) {unknown}; valid: {', '.join(ENTRY_KEYS)}")
    entry: dict[str, Any] = _entry_of(shipped) if shipped else {}
    entry.update(spec)
    missing = [k for k in ("patterns", "memory_gb") if k not in entry]
    if missing:
        raise ValueError(f"{where} a card gpuledger does not ship needs {' and '.join(missing)} (patterns: the "
                         f"driver's names it matches, e.g. ['\\bRTX PRO 6000\\b'])")
    _check(where, entry)
    try:
        card = model_from_entry(name, entry, SITE)
    except ValueError as exc:
        raise ValueError(f"{where} {exc}") from exc
    for profile in card.mig_profiles:
        if profile.compute_slices > card.mig_slices or profile.memory_gb > card.memory_gb:
            raise ValueError(f"{where} MIG profile {profile.name} does not fit a card of {card.mig_slices} "
                             f"compute slices and {card.memory_gb} GB (set mig_slices)")
    taken = [m.name for m in CATALOG if m.name != name and any(
        re.search(p, m.driver_name, re.IGNORECASE) for p in card.patterns)]
    if taken:  # a site card is tried first: a broad pattern takes these cards' GPUs (and their rates) away
        log.warning("%s: its patterns also match the driver names of %s, whose GPUs will be named %s", where,
                    ", ".join(taken), name)
    return card


def _entry_of(card: GpuModel) -> dict[str, Any]:
    """A shipped card as the entry a site's table changes key by key."""
    entry = {k: v for k, v in asdict(card).items() if k in ENTRY_KEYS}
    entry["mig_profiles"] = [p.name for p in card.mig_profiles]
    return entry


def _check(where: str, entry: dict[str, Any]) -> None:
    patterns = entry["patterns"]
    if isinstance(patterns, str):
        patterns = entry["patterns"] = [patterns]
    if not isinstance(patterns, (list, tuple)) or not patterns or len(patterns) > MAX_PATTERNS:
        raise ValueError(f"{where} patterns must be a list of 1 to {MAX_PATTERNS} regular expressions")
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN_CHARS:
            raise ValueError(f"{where} each pattern must be text of 1 to {MAX_PATTERN_CHARS} characters")
        try:
            re.compile(pattern, re.IGNORECASE)
        except re.error as exc:
            raise ValueError(f"{where} pattern {pattern!r} is not a regular expression: {exc}") from exc
    for key, (low, high) in NUMBERS.items():
        value = entry.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not low <= value <= high:
            raise ValueError(f"{where} {key} must be a number from {low} to {high}, got {value!r}")
    for key, most in TEXTS.items():
        value = entry.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > most):
            raise ValueError(f"{where} {key} must be text of at most {most} characters")
    if not isinstance(entry.get("nvlink", False), bool):
        raise ValueError(f"{where} nvlink must be true or false")
    profiles = entry.get("mig_profiles", [])
    if not isinstance(profiles, (list, tuple)) or not all(isinstance(p, str) for p in profiles) or len(profiles) > 20:
        raise ValueError(f"{where} mig_profiles must be a list of at most 20 profile names like 1g.10gb")


def renamed_rates(rates: Mapping[str, float], given: set[str]) -> dict[str, float]:
    """Rates a site keyed by a card's driver name ("NVIDIA RTX A5000", "RTX 6000 Ada") from before the catalogue
    named the card, carried to the card's name ("RTX-A5000") unless the site priced that too: its new samples carry
    the card's name, its older ones the driver's, and both stay priced (the rate under the old key stays)."""
    out = {}
    for key in given:
        card = normalize_model(key)
        if card != key and card in MODELS and card not in given and key in rates:
            out[card] = rates[key]
    return out
