"""`GET /v1/reports/{week}`: the weekly report of an ISO week made by the running server, as a zip of its pages and
CSVs (deploy/report_bundle.py), for `gpuledger report --server` and for anyone who wants a week's report without
waiting for Monday's. A reader or admin gets every file; a team token its own team's page and CSV only."""
from __future__ import annotations

import tempfile

from fastapi import APIRouter
from fastapi import Path as PathParam
from fastapi.responses import Response

from gpuledger.analytics.windows import iso_week
from gpuledger.collector.errors import NotFoundError
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.deploy.api.deps import ConfigDep, StoreDep
from gpuledger.deploy.report_bundle import pack
from gpuledger.deploy.weekly_report import weekly_report

router = APIRouter(tags=["reports"])
WEEK = PathParam(..., max_length=16, pattern=r"^(last|current|\d{4}-W\d{2})$",
                 description="an ISO week such as 2026-W48, `last` (the last complete week) or `current`")


@router.get("/v1/reports/{week}", response_class=Response, responses={200: {
    "content": {"application/zip": {}},
    "description": "a zip: manifest.json (which file is the admin page, the summary, each team's page and CSV) "
                   "and the files"}, 404: {"description": "no samples in the week, or none of the caller's team"}})
def week_report(caller: ReadCaller, store: StoreDep, config: ConfigDep, week: str = WEEK) -> Response:
    """The week's report as `gpuledger report` writes it: cost per team and GPU model, waste, queues, outcomes,
    inference cost and the advice as of the week's end (as of now for `current`)."""
    start, end, label = iso_week(week)
    if store.sample_count(start, end) == 0:
        raise NotFoundError(f"no samples in week {label} ({start:%Y-%m-%d} to {end:%Y-%m-%d}): nothing to report")
    with tempfile.TemporaryDirectory(prefix="gpuledger-report-") as folder:
        data = pack(weekly_report(store, config, folder, week), caller.team)
    return Response(data, media_type="application/zip",
                    headers={"Content-Disposition": f'attachment; filename="gpuledger-{label}.zip"'})


__all__ = ["router"]
