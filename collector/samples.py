"""The one sample schema every source emits and the store ingests.

A row is one GPU (or one MIG instance) at one instant. Keeping every source on the same
Arrow schema is what lets the store append a whole batch in a single bulk insert and lets
analytics ignore where a sample came from.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import pyarrow as pa

# The two owner buckets of the bill besides real teams, in the style of OpenCost's __idle__ and
# __unallocated__. Analytics pass these to SQL as parameters; the dashboard and report show labels.
UNATTRIBUTED = "unattributed"  # allocated, but no rule names a team (pods in `default`, unknown users)
IDLE_CAPACITY = "__idle__"  # GPUs no job held: the cluster's idle capacity
BUCKET_LABELS = {UNATTRIBUTED: "unattributed", IDLE_CAPACITY: "idle capacity"}


def owner_label(team: str) -> str:
    """How a team or owner bucket is shown to people."""
    return BUCKET_LABELS.get(team, team)


SAMPLE_SCHEMA = pa.schema(
    [
        ("ts", pa.timestamp("us", tz="UTC")),
        ("interval_s", pa.float64()),  # the wall time this sample stands for
        ("node", pa.string()),
        ("gpu_index", pa.int32()),
        ("gpu_uuid", pa.string()),
        ("gpu_model", pa.string()),  # normalised rate-card model, e.g. "H100"
        ("model_name", pa.string()),  # raw name as the driver reports it
        ("mig_profile", pa.string()),  # e.g. "1g.10gb"; null for a whole GPU
        ("mig_instance", pa.int32()),
        ("gpu_fraction", pa.float64()),  # share of a physical GPU this row stands for
        ("allocated", pa.bool_()),
        ("util_pct", pa.float64()),
        ("sm_active", pa.float64()),  # 0..1
        ("sm_occupancy", pa.float64()),  # 0..1
        ("tensor_active", pa.float64()),  # 0..1
        ("dram_active", pa.float64()),  # 0..1
        ("mem_used_mib", pa.float64()),
        ("mem_free_mib", pa.float64()),
        ("mem_reserved_mib", pa.float64()),
        ("mem_total_mib", pa.float64()),
        ("power_w", pa.float64()),
        ("power_avg_w", pa.float64()),  # from the cumulative energy counter: mean power over the interval
        ("temp_c", pa.float64()),
        ("nvlink_tx_bps", pa.float64()),
        ("nvlink_rx_bps", pa.float64()),
        ("pcie_tx_bps", pa.float64()),
        ("pcie_rx_bps", pa.float64()),
        ("nvlink_bps", pa.float64()),  # both directions, where only a total is read (NVLINK_BANDWIDTH_TOTAL)
        ("namespace", pa.string()),
        ("pod", pa.string()),
        ("container", pa.string()),
        ("job_id", pa.string()),
        ("user", pa.string()),
        ("team", pa.string()),
        ("source", pa.string()),
        # Kubernetes Dynamic Resource Allocation: the ResourceClaim the GPU was allocated through ("namespace/name")
        # and the device it names ("driver/pool/device"), as dcgm-exporter's DRA labels say; null without DRA
        ("dra_claim", pa.string()),
        ("dra_device", pa.string()),
        # GPU health, as read at this instant (analytics/store/health.py turns changes into events)
        ("xid", pa.int32()),  # the last XID error the driver reported; 0: none since boot
        ("throttle_reasons", pa.int64()),  # NVML's clocks-event reasons bitmask (gpu_health.THROTTLE_KINDS)
        ("ecc_sbe_total", pa.int64()),  # volatile single-bit ECC errors since boot
        ("ecc_dbe_total", pa.int64()),  # volatile double-bit ECC errors since boot
        ("remapped_rows_corr", pa.int64()),  # rows remapped after correctable errors
        ("remapped_rows_uncorr", pa.int64()),  # rows remapped after uncorrectable errors
        ("row_remap_failed", pa.bool_()),
    ]
)

# the profiling readings above, each a fraction of the interval (DCGM's DCP fields, NVML's GPM metrics on Hopper and
# later): what a GPU achieved, where GPU_UTIL only says a kernel was running. Not every GPU reports them: a GPU that
# does not has NULL, never 0
PROFILING_FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active")
# the health readings above: sources read them as numbers, the store derives events from their changes
HEALTH_COLUMNS = ("xid", "throttle_reasons", "ecc_sbe_total", "ecc_dbe_total", "remapped_rows_corr",
                  "remapped_rows_uncorr", "row_remap_failed")
# Columns added after agents were already in the field: a batch from an older agent (or its spool) lacks them, and
# the store fills them with nulls rather than refusing the batch.
ADDED_COLUMNS = frozenset({"nvlink_bps", *HEALTH_COLUMNS, "dra_claim", "dra_device"})


PROCESS_SCHEMA = pa.schema(
    [
        ("ts", pa.timestamp("us", tz="UTC")),
        ("node", pa.string()),
        ("gpu_uuid", pa.string()),
        ("pid", pa.int64()),
        ("used_mem_mib", pa.float64()),
        ("user", pa.string()),
        ("job_id", pa.string()),
    ]
)


def rows_to_table(rows: Iterable[Mapping[str, Any]], schema: pa.Schema = SAMPLE_SCHEMA) -> pa.Table:
    """Build a table from dict rows; missing keys become nulls so sources only fill what they read."""
    rows = list(rows)
    columns = {name: [row.get(name) for row in rows] for name in schema.names}
    return pa.Table.from_pydict(columns, schema=schema)



CARD_FIELDS = ("ts", "interval_s", "node", "gpu_index", "gpu_uuid", "gpu_model", "model_name", "source")


def unheld_part(instance: dict[str, Any], fraction: float) -> dict[str, Any]:
    """The part of a MIG card no instance holds, as a row of its own: the card's identity (from one of its
    instances), unallocated, and no readings (nothing measured it)."""
    return {**{k: instance[k] for k in CARD_FIELDS if k in instance}, "gpu_fraction": fraction, "allocated": False,
            "mig_profile": None, "mig_instance": None}
