"""What every router needs: the store and config of the app, the window query parameters, the write token."""
from __future__ import annotations

import secrets
from datetime import datetime
from typing import Annotated

from fastapi import Depends, HTTPException, Query, Request

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.windows import rolling
from gpuledger.deploy.api.models import Window


def store_of(request: Request) -> Store:
    return request.app.state.store


def config_of(request: Request) -> Config:
    return request.app.state.config


StoreDep = Annotated[Store, Depends(store_of)]
ConfigDep = Annotated[Config, Depends(config_of)]

Days = Query(7.0, gt=0, le=366, description="Window length in days, ending at `end`")
End = Query(None, description="Window end (ISO 8601); default now")
BucketMinutes = Query(60, ge=1, le=1440, description="Time bucket of a series, in minutes")


def window(days: float, end: datetime | None) -> tuple[datetime, datetime, Window]:
    """The window [end - days, end), and its model for the answer."""
    start, stop = rolling(days, end)
    return start, stop, Window(start=start, end=stop)


def check_token(expected: str | None, authorization: str | None) -> None:
    """Every write needs the server's bearer token; a server started without one accepts no writes."""
    if not expected:
        raise HTTPException(status_code=403, detail="this server accepts no writes: start it with --token")
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(status_code=401, detail="missing or wrong bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
