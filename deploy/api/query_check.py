"""A query parameter the route does not take is refused (422 naming it and what the route takes), never ignored.

Why: FastAPI drops unknown query parameters, so `GET /v1/ledger/statements/2026-11?team=nlp` answered every team's
statement, `GET /v1/recommendations?status=accepted` proposed advice too, and a caller who misspelt a filter read an
unfiltered answer as a filtered one. Runs as an app-wide dependency, after routing (the route is known) and before
the route's own work.
"""
from __future__ import annotations

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from gpuledger.collector.errors import InputError


# OpenCost's API: its clients (the OpenCost UI, kubectl-cost) send parameters OpenCost defines that gpuledger does
# not implement (resolution, filter...); refused, a compatible client would break, so these paths keep FastAPI's way
COMPATIBLE_PREFIXES = ("/allocation",)


def accepted(route: APIRoute) -> frozenset[str]:
    """The query parameters `route` and its dependencies declare, by the name a caller writes (alias); worked out
    once and kept on the route itself (a cache keyed by id() would hand a new app's route a dead route's set)."""
    known = getattr(route, "_gpuledger_query", None)
    if known is None:
        known = frozenset(_declared(route.dependant))
        route._gpuledger_query = known  # type: ignore[attr-defined]
    return known


def _declared(dependant: Dependant) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _declared(sub)
    return names


def known_query_only(request: Request) -> None:
    route = request.scope.get("route")
    if (not isinstance(route, APIRoute) or not route.include_in_schema or not request.query_params
            or route.path.startswith(COMPATIBLE_PREFIXES)):
        return  # /docs and / are pages a browser may append anything to
    unknown = sorted(set(request.query_params) - accepted(route))
    if unknown:
        takes = ", ".join(sorted(accepted(route))) or "none"
        raise InputError(f"unknown query parameter(s) {', '.join(ascii(u)[1:-1][:64] for u in unknown[:5])}: "
                         f"{route.path} takes {takes}")


__all__ = ["known_query_only"]
