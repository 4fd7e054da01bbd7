"""Map the many spellings drivers and exporters use for a GPU to one rate-card model name.

Rates are set per model ("H100"), but NVML and dcgm-exporter report marketing strings
("NVIDIA H100 80GB HBM3", "Tesla T4"). Unknown names are kept verbatim so they surface as
unpriced rather than silently priced as something else.
"""
from __future__ import annotations

import re

# Order matters: the first pattern that matches wins (H100 before H10, A100-80 before A100).
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), model)
    for p, model in (
        (r"\bH200\b", "H200"),
        (r"\bH100\b", "H100"),
        (r"\bA100\b.*\b80\s*GB\b|\bA100-SXM4-80GB\b|\bA100-PCIE-80GB\b|\bA100 80GB\b", "A100-80GB"),
        (r"\bA100\b", "A100-40GB"),
        (r"\bL40S\b", "L40S"),
        (r"\bL4\b", "L4"),
        (r"\bA10G\b", "A10G"),
        (r"\bT4\b", "T4"),
        (r"\bV100\b", "V100"),
    )
)

# Compute slices per physical GPU for MIG-capable models: a "3g.40gb" instance is 3/7 of an H100.
MIG_SLICES: dict[str, int] = {"H200": 7, "H100": 7, "A100-80GB": 7, "A100-40GB": 7}

_MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb", re.IGNORECASE)


def normalize_model(name: str | None) -> str:
    """Return the rate-card model for a driver-reported name, or the stripped name itself if unknown."""
    if not name:
        return "unknown"
    for pattern, model in _PATTERNS:
        if pattern.search(name):
            return model
    return name.strip()


def mig_fraction(model: str, profile: str | None) -> float:
    """Share of a physical GPU that a MIG profile occupies; 1.0 for whole GPUs or unparsable profiles."""
    if not profile:
        return 1.0
    match = _MIG_PROFILE.match(profile)
    if not match:
        return 1.0
    slices = MIG_SLICES.get(model, 7)
    return min(1.0, int(match.group(1)) / slices)


def mig_memory_gb(profile: str) -> int | None:
    match = _MIG_PROFILE.match(profile)
    return int(match.group(2)) if match else None

# MIG profiles per model as (name, compute slices of 7, memory GB), smallest first.
MIG_PROFILES: dict[str, tuple[tuple[str, int, int], ...]] = {
    "H100": (("1g.10gb", 1, 10), ("2g.20gb", 2, 20), ("3g.40gb", 3, 40), ("4g.40gb", 4, 40)),
    "A100-80GB": (("1g.10gb", 1, 10), ("2g.20gb", 2, 20), ("3g.40gb", 3, 40), ("4g.40gb", 4, 40)),
    "H200": (("1g.18gb", 1, 18), ("2g.35gb", 2, 35), ("3g.71gb", 3, 71), ("4g.71gb", 4, 71)),
    "A100-40GB": (("1g.5gb", 1, 5), ("2g.10gb", 2, 10), ("3g.20gb", 3, 20), ("4g.20gb", 4, 20)),
}

# Memory of whole GPUs, for "would fit on a smaller card" advice.
GPU_MEMORY_GB: dict[str, int] = {
    "H200": 141, "H100": 80, "A100-80GB": 80, "A100-40GB": 40, "L40S": 48, "L4": 24, "A10G": 24, "T4": 16, "V100": 32,
}
