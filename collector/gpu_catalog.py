"""The GPU catalogue: everything gpuledger knows about a GPU model, in one table.

Rates are set per model ("H100"), but NVML and dcgm-exporter report marketing strings
("NVIDIA H100 80GB HBM3", "Tesla T4"), MIG instances are fractions whose size depends on
the card (an A30 has 4 compute slices, an H100 7), fit advice needs each card's memory, and
the simulator needs what a driver would report. All of it is derived from `CATALOG`, so a
new model is one entry here. Unknown names are kept verbatim so they surface as unpriced
rather than silently priced as something else.

MIG geometry follows NVIDIA's MIG user guide ("Supported MIG Profiles"): compute slices per
GPU and, per profile, its compute slices and memory.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

UNKNOWN_MODEL = "unknown"


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
    tdp_w: int
    nvlink: bool  # SXM/HGX boards: GPUs of a node talk over NVLink
    driver_name: str  # what NVML reports (the simulator reports this)
    mem_mib: int  # total memory as NVML reports it
    usd_per_gpu_hour: float | None = None  # default rate card (on-demand list price); None: unpriced by default
    mig_slices: int = 0  # compute slices of a MIG-capable card; 0: no MIG
    mig_profiles: tuple[MigProfile, ...] = ()  # smallest first
    # NVLink bandwidth of one GPU, both directions together, GB/s, as NVIDIA's datasheets state it (None: no NVLink);
    # what colocate advice compares a job's cross-node traffic with (policies/colocation.py)
    nvlink_gbytes_s: float | None = None


def _profiles(*specs: tuple[str, int, int]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(name, slices, mem) for name, slices, mem in specs)


# Order matters: the first pattern that matches wins (GB200 before B200, H100 NVL before H100, A100 80GB before
# A100).
CATALOG: tuple[GpuModel, ...] = (
    GpuModel("H200", (r"\bH200\b",), 141, 700, True, "NVIDIA H200", 143771, 7.91, 7, _profiles(
        ("1g.18gb", 1, 18), ("1g.35gb", 1, 35), ("2g.35gb", 2, 35), ("3g.71gb", 3, 71), ("4g.71gb", 4, 71),
        ("7g.141gb", 7, 141)), nvlink_gbytes_s=900),
    GpuModel("H100-NVL", (r"\bH100\b.*\bNVL\b",), 94, 400, True, "NVIDIA H100 NVL", 95830, None, 7, _profiles(
        ("1g.12gb", 1, 12), ("1g.24gb", 1, 24), ("2g.24gb", 2, 24), ("3g.47gb", 3, 47), ("4g.47gb", 4, 47),
        ("7g.94gb", 7, 94)), nvlink_gbytes_s=600),
    GpuModel("H100", (r"\bH100\b",), 80, 700, True, "NVIDIA H100 80GB HBM3", 81559, 6.88, 7, _profiles(
        ("1g.10gb", 1, 10), ("1g.20gb", 1, 20), ("2g.20gb", 2, 20), ("3g.40gb", 3, 40), ("4g.40gb", 4, 40),
        ("7g.80gb", 7, 80)), nvlink_gbytes_s=900),
    GpuModel("GB200", (r"\bGB200\b",), 186, 1200, True, "NVIDIA GB200", 189471, None, 7, _profiles(
        ("1g.23gb", 1, 23), ("1g.47gb", 1, 47), ("2g.47gb", 2, 47), ("3g.93gb", 3, 93), ("4g.93gb", 4, 93),
        ("7g.186gb", 7, 186)), nvlink_gbytes_s=1800),
    GpuModel("B200", (r"\bB200\b",), 180, 1000, True, "NVIDIA B200", 183359, None, 7, _profiles(
        ("1g.23gb", 1, 23), ("1g.45gb", 1, 45), ("2g.45gb", 2, 45), ("3g.90gb", 3, 90), ("4g.90gb", 4, 90),
        ("7g.180gb", 7, 180)), nvlink_gbytes_s=1800),
    GpuModel("A100-80GB", (r"\bA100\b.*\b80\s*GB\b", r"\bA100-SXM4-80GB\b", r"\bA100-PCIE-80GB\b"), 80, 400, True,
             "NVIDIA A100-SXM4-80GB", 81920, 3.43, 7, _profiles(
                 ("1g.10gb", 1, 10), ("1g.20gb", 1, 20), ("2g.20gb", 2, 20), ("3g.40gb", 3, 40), ("4g.40gb", 4, 40),
                 ("7g.80gb", 7, 80)), nvlink_gbytes_s=600),
    GpuModel("A100-40GB", (r"\bA100\b",), 40, 400, True, "NVIDIA A100-SXM4-40GB", 40960, 2.75, 7, _profiles(
        ("1g.5gb", 1, 5), ("1g.10gb", 1, 10), ("2g.10gb", 2, 10), ("3g.20gb", 3, 20), ("4g.20gb", 4, 20),
        ("7g.40gb", 7, 40)), nvlink_gbytes_s=600),
    GpuModel("A30", (r"\bA30\b",), 24, 165, False, "NVIDIA A30", 24576, None, 4, _profiles(
        ("1g.6gb", 1, 6), ("2g.12gb", 2, 12), ("4g.24gb", 4, 24))),
    GpuModel("L40S", (r"\bL40S\b",), 48, 350, False, "NVIDIA L40S", 46068, 1.86),
    GpuModel("L4", (r"\bL4\b",), 24, 72, False, "NVIDIA L4", 23034, 0.80),
    GpuModel("A10G", (r"\bA10G\b",), 24, 300, False, "NVIDIA A10G", 23028, 1.01),
    GpuModel("T4", (r"\bT4\b",), 16, 70, False, "Tesla T4", 15360, 0.53),
    GpuModel("V100", (r"\bV100\b",), 32, 300, True, "Tesla V100-SXM2-32GB", 32768, 3.06, nvlink_gbytes_s=300),
)

MODELS: dict[str, GpuModel] = {model.name: model for model in CATALOG}
_PATTERNS: tuple[tuple[re.Pattern[str], GpuModel], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), model) for model in CATALOG for pattern in model.patterns)
_MIG_PROFILE = re.compile(r"(\d+)g\.(\d+)gb", re.IGNORECASE)  # .match: at the start; .search: anywhere
DEFAULT_MIG_SLICES = 7  # a profile on a card the catalogue does not know: the common 7-slice geometry

# USD per GPU-hour, the default rate card.
DEFAULT_RATES: dict[str, float] = {m.name: m.usd_per_gpu_hour for m in CATALOG if m.usd_per_gpu_hour is not None}


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
    return [m.name for m in CATALOG if any(p.name == name for p in m.mig_profiles)]


def model_for_profile(profile: str | None) -> str | None:
    """The one catalogue model that has a MIG profile of this name (`1g.5gb`: A100-40GB), else None: pages of old
    exporters name the profile but not the card."""
    owners = models_with_profile(profile)
    return owners[0] if len(owners) == 1 else None


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
    """Whole cards with at least `need_gb` of memory and less than `than` has, smallest memory first."""
    ceiling = memory_gb(than) or 0
    return [m.name for m in sorted(CATALOG, key=lambda m: (m.memory_gb, m.name))
            if need_gb <= m.memory_gb < ceiling]


def has_tensor_cores(model: str | None) -> bool:
    """Whether `model` computes matrix math on tensor cores: every card in the catalogue does (Volta and later);
    an unknown model is not assumed to, so no advice rests on tensor pipes it may not have."""
    return model in MODELS
