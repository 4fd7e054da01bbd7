"""Runs on a node: telemetry sources (NVML, dcgm-exporter, simulator) emitting one Arrow sample schema, attribution, the GPU catalogue, the agent-server wire contract, and the agent (`agent/`)."""
