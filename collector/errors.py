"""The one base class for errors a user can act on, each class with the HTTP status it answers with.

Everything gpuledger raises on purpose (bad input, a missing file, an unreachable exporter, a
store another process holds) derives from GpuledgerError, and the CLI prints exactly those as
one line with exit code 2. Any other exception is a bug and keeps its traceback.

The API answers every GpuledgerError with its class's `http_status` and the message as `detail`
(one exception handler, deploy/api/__init__.py), so no route catches by hand what the class
already says: input 422, not found 404, conflict 409, unavailable 503 with Retry-After.
"""
from __future__ import annotations


class GpuledgerError(Exception):
    """A problem the user can fix; its message says what and how."""
    http_status: int = 500  # a problem of the server's own set-up (its config, its files): not the caller's
    retry_after_s: int | None = None  # with 503: when to try again


class InputError(GpuledgerError, ValueError):
    """A value given on the command line or in a request that cannot be used (a bad week, an unknown node)."""
    http_status = 422


class NotFoundError(InputError):
    """A named thing (a team, a recommendation, a token) that does not exist."""
    http_status = 404


class ConflictError(GpuledgerError):
    """A request that contradicts the state it finds (a decision on advice already decided)."""
    http_status = 409


class UnavailableError(GpuledgerError):
    """The server cannot do this now but may later (a store being written, a source not answering)."""
    http_status = 503
    retry_after_s = 10


class CatchingUpError(UnavailableError):
    """The server is folding a backlog of samples into its rollups; a read over it would scan the unfolded raw
    rows for minutes, so it is refused at once until the fold has caught up (GET /readyz says when)."""
    retry_after_s = 15
