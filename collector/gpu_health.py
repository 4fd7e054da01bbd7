"""What the GPU health fields mean: the one place that knows NVML's throttle bits and the XID codes admins meet.

Sources store health as read (the last XID, the throttle bitmask, ECC and row-remap counters); the store turns
changes of those into events (analytics/store/health.py). The kinds below are the events' `kind` values.
"""
from __future__ import annotations

# NVML's clocks-event (formerly "clocks throttle") reason bits, as nvmlDeviceGetCurrentClocksEventReasons and
# DCGM_FI_DEV_CLOCK_THROTTLE_REASONS report them. Idle, application-clock and sync-boost bits are not problems.
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80

# event kind -> the bits that raise it: a throttle event starts when any of its bits goes from clear to set
THROTTLE_KINDS: dict[str, int] = {
    "thermal_throttle": SW_THERMAL | HW_THERMAL,
    "power_throttle": SW_POWER_CAP | HW_POWER_BRAKE,
    "hw_slowdown": HW_SLOWDOWN,
}

# event kind -> the sample column whose rise raises it (a counter since boot; a fall is a reset, not an event)
COUNTER_KINDS: dict[str, str] = {
    "ecc_sbe": "ecc_sbe_total",
    "ecc_dbe": "ecc_dbe_total",
    "row_remap_corr": "remapped_rows_corr",
    "row_remap_uncorr": "remapped_rows_uncorr",
}

XID = "xid"  # a new XID code reported (the field holds the last one; it stays until the next)
ROW_REMAP_FAILURE = "row_remap_failure"  # the card ran out of spare rows: it needs service
KINDS = (XID, *THROTTLE_KINDS, *COUNTER_KINDS, ROW_REMAP_FAILURE)

# What the XID codes seen most on data-centre GPUs mean, in a few words (NVIDIA's "XID Errors" guide); the others
# are shown by number.
XID_MEANING: dict[int, str] = {
    13: "graphics engine exception (often the application)",
    31: "GPU memory page fault (often the application)",
    43: "GPU stopped processing (often the application)",
    45: "preemptive cleanup after a previous error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def xid_meaning(code: int | None) -> str:
    """A few words on an XID code, for tables and tooltips."""
    if code is None:
        return ""
    return XID_MEANING.get(int(code), "see NVIDIA's XID catalogue")
