"""The one base class for errors a user can act on.

Everything gpuledger raises on purpose (bad input, a missing file, an unreachable exporter, a
store another process holds) derives from GpuledgerError, and the CLI prints exactly those as
one line with exit code 2. Any other exception is a bug and keeps its traceback.
"""
from __future__ import annotations


class GpuledgerError(Exception):
    """A problem the user can fix; its message says what and how."""


class InputError(GpuledgerError, ValueError):
    """A value given on the command line or in a request that cannot be used (a bad week, an unknown node)."""
