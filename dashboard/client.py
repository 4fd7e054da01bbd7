"""Thin API client for the dashboard, kept apart from Streamlit so its error handling is testable."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import requests
import tomllib


class ApiUnavailable(RuntimeError):
    pass


def api_base() -> str:
    return os.environ.get("GPULEDGER_API", "http://127.0.0.1:8080").rstrip("/")


class NeedsToken(ApiUnavailable):
    """The API refused the call for want of a (better) token: 401 or 403."""


class Unanswerable(ApiUnavailable):
    """The API cannot answer the question as asked (422): the reason is the answer (no job records in the
    window, a proposal over capacity)."""


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _send(method: str, base: str, path: str, token: str | None, timeout: float, **kwargs: Any) -> requests.Response:
    """One request to the API; a network failure is ApiUnavailable naming the API's address."""
    try:
        return requests.request(method, f"{base}{path}", timeout=timeout, headers=_auth(token), **kwargs)
    except requests.RequestException as exc:
        raise ApiUnavailable(f"cannot reach the gpuledger API at {base}: {exc}") from exc


BUSY_RETRIES = 3  # a read refused because the server is answering many (429/503 with a short Retry-After)
BUSY_WAIT_MAX_S = 5.0


def get_json(base: str, path: str, token: str | None = None, **params: Any) -> Any:
    response = _send("GET", base, path, token, 60, params=params)
    for _ in range(BUSY_RETRIES):  # the server bounds reads in flight: a short wait, then the page renders
        wait = _busy_wait(response)
        if wait is None:
            break
        time.sleep(wait)
        response = _send("GET", base, path, token, 60, params=params)
    if response.status_code in (401, 403):
        raise NeedsToken(f"{path}: {response.json().get('detail', response.text[:300])}")
    if not response.ok:
        raise ApiUnavailable(f"{base}{path} answered {response.status_code}: {response.text[:300]}")
    return response.json()


def _busy_wait(response: requests.Response) -> float | None:
    """How long to wait before asking again when the server said it is busy for a moment; None otherwise (a
    backlog being folded says minutes: the page says so instead of waiting)."""
    if response.status_code not in (429, 503):
        return None
    try:
        wait = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return wait if 0 <= wait <= BUSY_WAIT_MAX_S else None


def deployment_token() -> str | None:
    """The token the dashboard was started with (GPULEDGER_TOKEN): what it reads with until someone signs in."""
    return os.environ.get("GPULEDGER_TOKEN") or None


def proxied_token(headers: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(user, token) for a dashboard behind the site's authenticating proxy: the proxy names the user in the header
    $GPULEDGER_TRUSTED_HEADER (e.g. X-Forwarded-Email), and $GPULEDGER_USER_TOKENS is a TOML file of `"user" =
    "token"`. (None, None) when either is unset or the user has no token. The header is trusted as is: the dashboard
    must be reachable only through that proxy."""
    header, table = os.environ.get("GPULEDGER_TRUSTED_HEADER"), os.environ.get("GPULEDGER_USER_TOKENS")
    user = headers.get(header) if header else None
    if not user or not table:
        return user, None
    try:
        tokens = tomllib.loads(Path(table).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ApiUnavailable(f"cannot read GPULEDGER_USER_TOKENS {table}: {exc}") from exc
    token = tokens.get(user)
    return user, token if isinstance(token, str) else None


def post_decision(base: str, rec_id: str, decision: str, by: str, token: str, note: str | None = None) -> dict:
    """Record a decision through the API; the API's refusal (401, 404, 409) comes back as ApiUnavailable's text."""
    response = _send("POST", base, f"/v1/recommendations/{rec_id}/decision", token, 60,
                     json={"decision": decision, "by": by, "note": note})
    if not response.ok:
        raise ApiUnavailable(f"the decision was refused ({response.status_code}): {response.text[:300]}")
    return response.json()


def _reason(response: requests.Response) -> str:
    """The API's own reason for a refusal: its `detail` (a sentence, or FastAPI's list of invalid fields), else the
    start of the body."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return response.text[:300]
    if isinstance(detail, list):  # FastAPI's validation errors: where in the body, and what is wrong there
        return "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:])}: {e.get('msg')}" if isinstance(e, dict) else str(e)
            for e in detail
        )
    return str(detail) if detail is not None else response.text[:300]


def post_json(base: str, path: str, body: dict, token: str | None = None, timeout: float = 300) -> Any:
    """POST a question that changes nothing (/v1/whatif): 401 and 403 come back as NeedsToken, any other refusal
    (422: a proposal the scheduler could not run) as ApiUnavailable with the API's reason. A what-if replays a
    window of jobs twice, so it may take longer than a read."""
    response = _send("POST", base, path, token, timeout, json=body)
    if response.status_code in (401, 403):
        raise NeedsToken(f"{path}: {_reason(response)}")
    if response.status_code == 422:
        raise Unanswerable(f"{path} was refused ({response.status_code}): {_reason(response)}")
    if not response.ok:
        raise ApiUnavailable(f"{path} was refused ({response.status_code}): {_reason(response)}")
    return response.json()


def quota_edits(seeded: list[dict[str, Any]], edited: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:
    """The what-if's `edits`: {team: {GPU model: {"guarantee": N, "limit": N}}} for the rows of the quota editor
    (`edited`, row for row the API's `quotas` it was seeded from) whose proposed numbers differ from the seed, each
    with only the number(s) changed. A cell emptied is no edit (the API takes numbers, not their removal)."""
    edits: dict[str, dict[str, dict[str, float]]] = {}
    for row, (_, now) in zip(seeded, edited.iterrows()):
        changed = {}
        for key, column in (("guarantee", "proposed_guarantee_gpus"), ("limit", "proposed_limit_gpus")):
            value, was = now.get(column), row.get(column)
            if value is None or pd.isna(value):
                continue
            if was is None or abs(float(value) - float(was)) > 1e-9:
                changed[key] = float(value)
        if changed:
            edits.setdefault(row["team"], {})[row["gpu_model"]] = changed
    return edits


def capacity_changes(seeded: dict[str, int], edited: pd.DataFrame) -> dict[str, int]:
    """The what-if's `capacity`: GPU model -> GPUs for the capacity editor's rows (columns gpu_model, gpus) that
    differ from the seed or name a model it did not have; a seeded model whose row was deleted is retired (0). Rows
    without a model or a number are skipped."""
    changes: dict[str, int] = {}
    kept = set()
    for _, row in edited.iterrows():
        model, gpus = row.get("gpu_model"), row.get("gpus")
        if model is None or (isinstance(model, float) and pd.isna(model)) or not str(model).strip():
            continue
        model = str(model).strip()
        kept.add(model)
        if gpus is None or pd.isna(gpus) or float(gpus) < 0:
            continue
        if model not in seeded or int(gpus) != int(seeded[model]):
            changes[model] = int(gpus)
    return changes | {model: 0 for model in seeded if model not in kept and seeded[model] != 0}


# GET /v1/capacity/forecast's figures per model, as the page's table shows them (the API's name -> the page's words)
FORECAST_COLUMNS = {
    "gpu_model": "GPU model",
    "status": "status",
    "gpus": "GPUs",
    "capacity_gpu_hours_per_week": "capacity (GPU-h/week)",
    "demand_now_gpu_hours_per_week": "demand now (GPU-h/week)",
    "utilisation_now": "of capacity",
    "growth_gpu_hours_per_week": "growth (GPU-h/week per week)",
    "growth_stderr": "growth std. error",
    "weeks_to_saturation": "weeks to saturation",
    "weeks_to_saturation_80_low": "soonest (80%)",
    "weeks_to_saturation_80_high": "latest (80%)",
    "saturates_around": "around",
    "basis": "demand counts",
    "whole_weeks": "weeks fitted",
}
FORECAST_WEEK_COLUMNS = ("gpu_model", "week_start", "covered_hours", "fitted", "allocated_gpu_hours",
                         "busy_gpu_hours", "queued_gpu_hours", "demand_gpu_hours")


def forecast_frames(answer: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per model, per model and week) tables of a capacity forecast. A figure the forecast could not give (no
    trend, not saturating, a week without samples or job records) stays missing, never 0: numbers are floats with
    NaN where the API said null."""
    models = pd.DataFrame([{k: m.get(k) for k in FORECAST_COLUMNS} for m in answer.get("models", [])],
                          columns=list(FORECAST_COLUMNS))
    weeks = pd.DataFrame([{"gpu_model": m["gpu_model"], **{k: w.get(k) for k in FORECAST_WEEK_COLUMNS[1:]}}
                          for m in answer.get("models", []) for w in m.get("weeks", [])],
                         columns=list(FORECAST_WEEK_COLUMNS))
    for table in (models, weeks):
        for column in table.columns:
            if column.endswith(("_hours", "_week", "_now", "_stderr", "_low", "_high", "saturation", "gpus")):
                table[column] = pd.to_numeric(table[column], errors="coerce").astype(float)
    for table, column in ((models, "saturates_around"), (weeks, "week_start")):
        table[column] = pd.to_datetime(table[column], utc=True, format="ISO8601")
    return models, weeks


def frame(rows: list[dict[str, Any]], time_columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """The rows as a table, their time columns as UTC timestamps.

    The API writes instants as ISO 8601 with and without fractional seconds (`...18:16:00Z` beside
    `...14:05:59.765540Z`: a bucket's start and a sample's time), so the format is ISO 8601 as such, never
    one inferred from the first value (which fails on the first row of the other shape)."""
    df = pd.DataFrame(rows)
    for column in time_columns:
        if column in df:
            df[column] = pd.to_datetime(df[column], utc=True, format="ISO8601")
    if "dra_claims" in df:  # a job's DRA claims, as text a table cell shows (blank: none)
        df["dra_claims"] = df["dra_claims"].map(lambda c: ", ".join(c) if isinstance(c, list) and c else None)
    return df


def calls(days: int, bucket: int, end: str) -> dict[str, tuple[str, dict]]:
    """Every call a dashboard page may need, by name (the soak benchmark makes the same ones). `end` pins every
    window (and the previous period's) to one instant."""
    before = (pd.Timestamp(end) - pd.Timedelta(days=days)).isoformat()
    return {
        "health": ("/healthz", {}),
        "util": ("/v1/cluster/utilization", {"days": days, "bucket_minutes": bucket, "end": end}),
        "costs": ("/v1/costs", {"days": days, "end": end}),
        "waste": ("/v1/waste", {"days": days, "limit": 100, "end": end}),
        "fairness": ("/v1/fairshare", {"days": days, "end": end}),
        "advice": ("/v1/recommendations", {}),
        "decided": ("/v1/recommendations/history", {"limit": 200}),
        "nodes": ("/v1/nodes", {}),
        "gpu_health": ("/v1/health", {"days": days, "limit": 200, "end": end}),
        "coverage": ("/v1/nodes/telemetry", {}),
        "fragments": ("/v1/fragmentation", {"days": days, "end": end}),
        "topology": ("/v1/topology", {}),  # as the nodes are now (the window ends at a whole minute)
        "inventory": ("/v1/nodes/inventory", {}),
        "costs_before": ("/v1/costs", {"days": days, "end": before}),
        "util_before": ("/v1/cluster/utilization", {"days": days, "bucket_minutes": bucket, "end": before}),
        "daily": ("/v1/costs/daily", {"days": days, "end": end}),
        "teams": ("/v1/teams", {}),
        "gpus": ("/v1/gpus", {"days": days, "bucket_minutes": max(bucket, 60), "end": end}),
        "workloads": ("/v1/workloads", {"days": days, "end": end}),
        "queues": ("/v1/workloads/queues", {"days": days, "end": end}),
        "job_coverage": ("/v1/workloads/coverage", {"days": days, "end": end}),
        "efficiency": ("/v1/efficiency", {"days": days, "end": end}),
        "users": ("/v1/users", {"days": days, "end": end}),
        "inference": ("/v1/inference", {"days": days, "end": end}),
        "periods": ("/v1/ledger/periods", {}),
        "budgets": ("/v1/budgets", {}),
        "alerts": ("/v1/alerts", {"limit": 100}),
        "forecast": ("/v1/capacity/forecast", {"end": end}),
    }
