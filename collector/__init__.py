"""Per-node telemetry sources (NVML, dcgm-exporter, simulator) that all emit the same Arrow sample schema."""
