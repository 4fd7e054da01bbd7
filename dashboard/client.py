"""Thin API client for the dashboard, kept apart from Streamlit so its error handling is testable."""
from __future__ import annotations

import os
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


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def get_json(base: str, path: str, token: str | None = None, **params: Any) -> Any:
    try:
        response = requests.get(f"{base}{path}", params=params, timeout=60, headers=_auth(token))
    except requests.RequestException as exc:
        raise ApiUnavailable(f"cannot reach the gpuledger API at {base}: {exc}") from exc
    if response.status_code in (401, 403):
        raise NeedsToken(f"{path}: {response.json().get('detail', response.text[:300])}")
    if not response.ok:
        raise ApiUnavailable(f"{base}{path} answered {response.status_code}: {response.text[:300]}")
    return response.json()


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
    try:
        response = requests.post(f"{base}/v1/recommendations/{rec_id}/decision", timeout=60,
                                 json={"decision": decision, "by": by, "note": note},
                                 headers=_auth(token))
    except requests.RequestException as exc:
        raise ApiUnavailable(f"cannot reach the gpuledger API at {base}: {exc}") from exc
    if not response.ok:
        raise ApiUnavailable(f"the decision was refused ({response.status_code}): {response.text[:300]}")
    return response.json()


def frame(rows: list[dict[str, Any]], time_columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """The rows as a table, their time columns as UTC timestamps.

    The API writes instants as ISO 8601 with and without fractional seconds (`...18:16:00Z` beside
    `...14:05:59.765540Z`: a bucket's start and a sample's time), so the format is ISO 8601 as such, never
    one inferred from the first value (which fails on the first row of the other shape)."""
    df = pd.DataFrame(rows)
    for column in time_columns:
        if column in df:
            df[column] = pd.to_datetime(df[column], utc=True, format="ISO8601")
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
        "costs_before": ("/v1/costs", {"days": days, "end": before}),
        "util_before": ("/v1/cluster/utilization", {"days": days, "bucket_minutes": bucket, "end": before}),
        "daily": ("/v1/costs/daily", {"days": days, "end": end}),
        "teams": ("/v1/teams", {}),
        "gpus": ("/v1/gpus", {"days": days, "bucket_minutes": max(bucket, 60), "end": end}),
        "workloads": ("/v1/workloads", {"days": days, "end": end}),
        "queues": ("/v1/workloads/queues", {"days": days, "end": end}),
        "job_coverage": ("/v1/workloads/coverage", {"days": days, "end": end}),
        "efficiency": ("/v1/efficiency", {"days": days, "end": end}),
        "inference": ("/v1/inference", {"days": days, "end": end}),
        "periods": ("/v1/ledger/periods", {}),
        "budgets": ("/v1/budgets", {}),
        "alerts": ("/v1/alerts", {"limit": 100}),
    }
