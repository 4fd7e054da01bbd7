"""Readers of public cluster traces (../shared/traces): each turns a trace's files into gpuledger's terms."""

# the traces gpuledger reads, once: the CLI's choices and deploy/trace_import.py's readers derive from this (kept
# here, apart from the readers, so `--help` does not import them)
TRACE_NAMES = ("openb", "philly", "helios", "genai")
