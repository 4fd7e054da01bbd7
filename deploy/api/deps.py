"""What every router needs: the store and config of the app, the window query parameters (who may call
what is deploy/api/access.py)."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import Depends, Query, Request

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.windows import EARLIEST, LATEST, rolling
from gpuledger.collector.errors import CatchingUpError
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


def fold_state(store: Store) -> dict:
    """How far the rollups are behind the newest sample, as /healthz and /readyz report it: constant cost (marks
    kept in memory and the one-row state table), so it answers while a backlog is folded."""
    folded, lag = store.fold_lag()
    return {"folded_until": folded, "fold_behind_minutes": None if lag is None else round(lag.total_seconds() / 60, 1),
            "catching_up": store.folding_backlog()}


def caught_up(request: Request) -> None:
    """Refuses an analytic read at once (503, Retry-After) while the server folds a backlog: the read would
    aggregate every unfolded raw sample and, with the fold, hold both cores for minutes (a liveness probe behind
    it would restart the server mid-fold). Reads are answered again as soon as the fold has caught up."""
    store = request.app.state.store
    if store.folding_backlog():
        state = fold_state(store)
        raise CatchingUpError(f"the server is folding a backlog of samples into its rollups (folded to "
                              f"{state['folded_until']}, {state['fold_behind_minutes']} minutes behind the newest "
                              "sample); this read is answered once it has caught up: GET /readyz says when")


CaughtUp = Depends(caught_up)
