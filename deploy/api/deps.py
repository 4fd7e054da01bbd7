"""What every router needs: the store and config of the app, the window query parameters (who may call
what is deploy/api/access.py)."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import Depends, Query, Request

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.windows import EARLIEST, LATEST, rolling
from gpuledger.deploy.api.models import Window


def store_of(request: Request) -> Store:
    return request.app.state.store


def config_of(request: Request) -> Config:
    return request.app.state.config


StoreDep = Annotated[Store, Depends(store_of)]
ConfigDep = Annotated[Config, Depends(config_of)]

Days = Query(7.0, gt=0, le=366, description="Window length in days, ending at `end`")
End = Query(None, ge=EARLIEST, le=LATEST,  # year 1 overflowed date arithmetic: a 500 on every windowed route
            description="Window end (ISO 8601), between 2000-01-01 and 2200-01-01; default now")
BucketMinutes = Query(60, ge=1, le=1440, description="Time bucket of a series, in minutes")


def window(days: float, end: datetime | None) -> tuple[datetime, datetime, Window]:
    """The window [end - days, end), and its model for the answer."""
    start, stop = rolling(days, end)
    return start, stop, Window(start=start, end=stop)
