"""The GPU catalogue: everything gpuledger knows about a GPU model, in one table.

Rates are set per model ("H100"), but NVML and dcgm-exporter report marketing strings
("NVIDIA H100 80GB HBM3", "Tesla T4"), MIG instances are fractions whose size depends on
the card (an A30 has 4 compute slices, an H100 7), fit advice needs each card's memory, and
the simulator needs what a driver would report. All of it is derived from the catalogue, which is
data: the cards gpuledger ships (gpu_catalogue.toml beside this file, so a new card is an entry there)
and the cards a site adds or overrides in its config (`[catalogue."NAME"]`, read by
analytics/catalogue_config.py and handed to `use_site_models`). Unknown names are kept verbatim so they
surface as unpriced rather than silently priced as something else.

MIG geometry follows NVIDIA's MIG user guide ("Supported MIG Profiles"): compute slices per
GPU and, per profile, its compute slices and memory.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, Iterable

UNKNOWN_MODEL = "unknown"
BUILT_IN = "built-in"  # where a card's entry comes from: gpuledger's file
SITE = "site"  # or the site's config
CATALOGUE_FILE = "gpu_catalogue.toml"


@dataclass(frozen=True)
class MigProfile:
    name: str  # e.g. "3g.40gb"
    compute_slices: int
    memory_gb: int


@dataclass(frozen=True)
class GpuModel:
    name: str  # the rate-card model
    patterns: tuple[str, ...]  # regular expressions on the driver's name; the first model that matches wins
    memory_gb: int
    tdp_w: int | None  # board power (the simulator); None where a site did not say
    nvlink: bool  # SXM/HGX boards: GPUs of a node talk over NVLink
    driver_name: str  # what NVML reports (the simulator reports this)
    mem_mib: int  # total memory as NVML reports it
    usd_per_gpu_hour: float | None = None  # default rate card (on-demand list price); None: unpriced by default
    mig_slices: int = 0  # compute slices of a MIG-capable card; 0: no MIG
    mig_profiles: tuple[MigProfile, ...] = ()  # smallest first
    # NVLink bandwidth of one GPU, both directions together, GB/s, as NVIDIA's datasheets state it (None: no NVLink);
    # what colocate advice compares a job's cross-node traffic with (policies/colocation.py)
    nvlink_gbytes_s: float | None = None
    price_basis: str | None = None  # where the default rate comes from (None: there is none)
    source: str = BUILT_IN  # BUILT_IN or SITE


_MIG_PROFILE = re.compile(r"(\d+)g\.(\d+)gb", re.IGNORECASE)  # .match: at the start; .search: anywhere
DEFAULT_MIG_SLICES = 7  # a profile on a card the catalogue does not know: the common 7-slice geometry
# the keys of a card's entry, in the file and in a site's [catalogue."NAME"] (the name is the table's)
ENTRY_KEYS = ("patterns", "memory_gb", "tdp_w", "nvlink", "nvlink_gbytes_s", "driver_name", "mem_mib",
              "usd_per_gpu_hour", "price_basis", "mig_slices", "mig_profiles")


def profiles_named(names: Iterable[str]) -> tuple[MigProfile, ...]:
    """MIG profiles from their names ("3g.40gb": 3 compute slices, 40 GB), smallest first; a name that is not of
    that form raises ValueError."""
    out = []
    for name in names:
        match = _MIG_PROFILE.fullmatch(name.lower())
        if not match:
            raise ValueError(f"{name!r} is not a MIG profile name like 1g.10gb")
        out.append(MigProfile(name.lower(), int(match.group(1)), int(match.group(2))))
    return tuple(sorted(out, key=lambda p: (p.compute_slices, p.memory_gb)))


def model_from_entry(name: str, entry: dict[str, Any], source: str = BUILT_IN) -> GpuModel:
    """One card from its entry (the file's `[[gpu]]` or a site's table); missing optional keys take their defaults:
    no NVLink, no MIG, no default rate, the memory as NVML would report it and the first pattern as the driver name."""
    memory = int(entry["memory_gb"])
    return GpuModel(
        name=name, patterns=tuple(entry["patterns"]), memory_gb=memory, tdp_w=entry.get("tdp_w"),
        nvlink=bool(entry.get("nvlink", False)), driver_name=entry.get("driver_name") or name,
        mem_mib=int(entry.get("mem_mib") or memory * 1024), usd_per_gpu_hour=entry.get("usd_per_gpu_hour"),
        mig_slices=int(entry.get("mig_slices", 0)), mig_profiles=profiles_named(entry.get("mig_profiles", ())),
        nvlink_gbytes_s=entry.get("nvlink_gbytes_s"), price_basis=entry.get("price_basis"), source=source)


def _shipped() -> tuple[GpuModel, ...]:
    data = tomllib.loads(files("gpuledger.collector").joinpath(CATALOGUE_FILE).read_text())
    return tuple(model_from_entry(entry["name"], {k: v for k, v in entry.items() if k != "name"})
                 for entry in data["gpu"])


# The cards gpuledger ships, in the file's order (the first pattern that matches wins: GB200 before B200, H100 NVL
# before H100, A100 80GB before A100).
CATALOG: tuple[GpuModel, ...] = _shipped()

# USD per GPU-hour, the default rate card: the shipped cards' list prices.
DEFAULT_RATES: dict[str, float] = {m.name: m.usd_per_gpu_hour for m in CATALOG if m.usd_per_gpu_hour is not None}

# The catalogue in force: the site's cards first (so one may override or precede a shipped card), then the shipped
# ones it does not override. Changed in place by `use_site_models`, so modules that imported them see the change.
MODELS: dict[str, GpuModel] = {}
_PATTERNS: list[tuple[re.Pattern[str], GpuModel]] = []


def use_site_models(site: Iterable[GpuModel] = ()) -> None:
    """Put the site's cards in force beside the shipped ones (none: the shipped catalogue alone). Called when a
    config is loaded, so the collectors of that process name the site's cards as the site does."""
    site = tuple(site)
    overridden = {m.name for m in site}
    in_force = [*site, *(m for m in CATALOG if m.name not in overridden)]
    MODELS.clear()
    MODELS.update({m.name: m for m in in_force})
    _PATTERNS[:] = [(re.compile(pattern, re.IGNORECASE), m) for m in in_force for pattern in m.patterns]


def site_models() -> list[GpuModel]:
    return [m for m in MODELS.values() if m.source == SITE]


use_site_models()


# A vGPU as a guest's driver names it: "GRID A100-10C", "NVIDIA A100D-20C" (D: the 80 GB card), "GRID T4-4Q": the
# card, then the profile's framebuffer in GB and its series letter (NVIDIA's vGPU user guide, "Virtual GPU Types")
VGPU_PROFILE = r"([A-Z]+\d+[A-Z]*?)(D?)-(\d+)([ABCQ])"  # the profile's name: card, framebuffer GB, series
VGPU_NAME = r"\b(?:GRID|NVIDIA)\s+(" + VGPU_PROFILE + r")\b"  # one capturing group around the profile's name
_VGPU = re.compile(VGPU_NAME, re.IGNORECASE)


def _vgpu(name: str) -> tuple[str, int] | None:
    """(the physical card's driver name, the profile's framebuffer GB) when `name` is a vGPU profile."""
    match = _VGPU.search(name)
    return (match.group(2) + (" 80GB" if match.group(3) else ""), int(match.group(4))) if match else None


def vgpu_profile(name: str | None) -> str | None:
    """The vGPU profile a guest's driver names ("GRID A100-10C" -> "A100-10C"), or None for a physical GPU."""
    match = _VGPU.search(name or "")
    return match.group(1).upper() if match else None


def normalize_model(name: str | None) -> str:
    """Return the rate-card model for a driver-reported name (a vGPU profile: its card's), or the stripped name
    itself if unknown."""
    if not name:
        return UNKNOWN_MODEL
    vgpu = _vgpu(name)
    if vgpu:
        name = vgpu[0]
    for pattern, model in _PATTERNS:
        if pattern.search(name):
            return model.name
    return name.strip()


def mig_share(model: str, profile: str) -> float | None:
    """Share of a physical GPU that a MIG profile occupies (its compute slices over the card's), or None when the
    profile names no slice count. The name is searched, not matched, so decorated names still parse."""
    match = _MIG_PROFILE.search(profile)
    if not match:
        return None
    known = MODELS.get(model)
    slices = known.mig_slices if known and known.mig_slices else DEFAULT_MIG_SLICES
    return min(1.0, int(match.group(1)) / slices)


def vgpu_share(model_name: str | None) -> float | None:
    """Share of its physical card a vGPU profile holds (its framebuffer over the card's), or None when the name is
    not a vGPU profile of a known card. vGPU time-slices a card among profiles sized by framebuffer, so that is the
    part of the card a guest holds and is billed."""
    vgpu = _vgpu(model_name or "")
    total = memory_gb(normalize_model(vgpu[0])) if vgpu else None
    return min(1.0, vgpu[1] / total) if vgpu and total else None


def mig_fraction(model: str, profile: str | None) -> float:
    """Share of a physical GPU that a MIG profile occupies; 1.0 for whole GPUs or unparsable profiles (NVML names
    are always parsable; exporters' pages go through `mig_share` and split what is unknown)."""
    if not profile:
        return 1.0
    share = mig_share(model, profile)
    return 1.0 if share is None else share


def models_with_profile(profile: str | None) -> list[str]:
    """The catalogue models that offer a MIG profile of this name (`1g.10gb`: A100-80GB and H100); none for a card
    without MIG (L4, L40S) or a profile no card has."""
    match = _MIG_PROFILE.search(profile or "")
    if not match:
        return []
    name = match.group(0).lower()
    return [m.name for m in MODELS.values() if any(p.name == name for p in m.mig_profiles)]


def model_for_profile(profile: str | None) -> str | None:
    """The catalogue model a MIG profile of this name names, for pages of old exporters that name the profile but
    not the card: its one owner (`1g.6gb`: A30), else the one owner with a default rate, the common card of a
    shared geometry (`1g.5gb`: A100-40GB, not the regional A800-40GB; `1g.18gb`: H200, not H200 NVL or GH200), else
    None (`1g.10gb`: A100-80GB or H100, whose rates differ twofold)."""
    owners = models_with_profile(profile)
    priced = [o for o in owners if MODELS[o].usd_per_gpu_hour is not None]
    return owners[0] if len(owners) == 1 else priced[0] if len(priced) == 1 else None


def mig_memory_gb(profile: str) -> int | None:
    match = _MIG_PROFILE.match(profile)
    return int(match.group(2)) if match else None


def mig_profiles(model: str) -> tuple[MigProfile, ...]:
    """The MIG profiles of `model`, smallest first; none for a card without MIG or not in the catalogue."""
    known = MODELS.get(model)
    return known.mig_profiles if known else ()


def memory_gb(model: str) -> int | None:
    known = MODELS.get(model)
    return known.memory_gb if known else None


def smaller_cards(need_gb: float, than: str) -> list[str]:
    """Whole cards with at least `need_gb` of memory and less than `than` has, smallest memory first: among the
    cards with a list price only (the catalogue's default rate, or a site card's `usd_per_gpu_hour`), since advice
    to move to a card is worth its saving, and a card without a price has none to show (nor is a workstation card
    the catalogue lists for naming what a site runs a place to move a data-center job to)."""
    ceiling = memory_gb(than) or 0
    return [m.name for m in sorted(MODELS.values(), key=lambda m: (m.memory_gb, m.name))
            if need_gb <= m.memory_gb < ceiling and m.usd_per_gpu_hour is not None]


def has_tensor_cores(model: str | None) -> bool:
    """Whether `model` computes matrix math on tensor cores: every card in the catalogue does (Volta and later);
    an unknown model is not assumed to, so no advice rests on tensor pipes it may not have."""
    return model in MODELS
