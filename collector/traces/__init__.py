"""Readers of public cluster traces (../shared/traces): each turns a trace's files into gpuledger's terms."""
