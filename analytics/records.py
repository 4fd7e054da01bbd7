"""Analytics results as JSON-safe records, for the API, the CLI and stored evidence.

DataFrames carry numpy scalars, pandas timestamps and NaN, none of which JSON takes.
"""
from __future__ import annotations

import math
from functools import lru_cache
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd


def json_safe(value: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, timestamps to ISO strings, NaN to None."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is pd.NaT:  # an all-null timestamp column (a token never revoked)
        return None
    if isinstance(value, (pd.Timestamp, datetime)):
        return value.isoformat()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A frame's rows as JSON-safe dicts."""
    return json_safe(frame.to_dict(orient="records"))


# A spreadsheet runs a cell that starts with one of these as a formula (OWASP "CSV injection"): `=HYPERLINK(...)`
# in a team or job name would run when finance opens the file. Tab and CR start one too in some spreadsheets.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A text cell that a spreadsheet would read as a formula, prefixed with `'` so it shows as the text it is;
    anything else (numbers, negative ones included, dates, nulls) unchanged."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


MONEY_DECIMALS = 2  # amounts in a CSV: cents (a statement's are whole cents already)
QUANTITY_DECIMALS = 6  # GPU-hours, shares, prices per GPU-hour: a microhour, past any float noise
FOCUS_AMOUNTS = ("BilledCost", "EffectiveCost", "ListCost", "ContractedCost", "PricingCurrencyEffectiveCost")


def is_money(column: str) -> bool:
    """An amount of dollars (not a price per unit): `usd`, `*_usd` and `*_usd_per_day|week|month` (an amount a
    period), and FOCUS's cost columns. `usd_per_gpu_hour` and `cost_per_million_tokens` are prices: quantities."""
    return (column == "usd" or column.endswith("_usd") or column in FOCUS_AMOUNTS
            or column.endswith(("usd_per_day", "usd_per_week", "usd_per_month")))


def rounded_figure(value: float, money: bool) -> float:
    """One figure as people read it: an amount to the cent; a quantity to six decimals, or to six significant
    digits below 1 (a fair-share usage of 1.2e-07 is not zero). NaN and infinities are left to `json_safe`."""
    if not math.isfinite(value):
        return value
    if money:
        return round(value, MONEY_DECIMALS)
    return round(value, QUANTITY_DECIMALS) if abs(value) >= 1 else float(f"{value:.{QUANTITY_DECIMALS}g}")


def rounded(value: Any, key: str = "") -> Any:
    """A JSON answer with every float rounded by `rounded_figure`, judged money or quantity by the name of the
    field that holds it (a list's items by the list's name): the API's answers, like the CSVs, carry `2226.425`,
    not `2226.4250000001957`. Storage stays exact; this runs only where an answer leaves the server, so it is
    written for answers of 100,000 rows (one test of the key per field name, not per value)."""
    return _rounded_in(value, key)


@lru_cache(maxsize=4096)
def _money(key: Any) -> bool:
    return isinstance(key, str) and is_money(key)


def _rounded_in(value: Any, key: Any) -> Any:
    """`rounded`'s walk: exact types first (the hot path), subclasses (numpy's float64) after."""
    if isinstance(value, float):
        return rounded_figure(float(value), _money(key))
    if isinstance(value, dict):
        return {k: _rounded_in(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded_in(v, key) for v in value]
    return value


def write_csv(frame: pd.DataFrame, path: Any) -> None:
    """The one way gpuledger writes a CSV: text cells neutralised by `csv_cell`, number columns as numbers, floats
    rounded by `rounded_figure` (`2226.425`, not `2226.4250000001957`). Names in these files come from telemetry,
    and the files are opened in spreadsheets."""
    safe = frame.copy()
    for column in safe.columns:
        if pd.api.types.is_float_dtype(safe[column]):  # exact in storage, rounded where people read it
            money = is_money(str(column))
            safe[column] = safe[column].map(lambda v, m=money: rounded_figure(v, m), na_action="ignore")
        elif not pd.api.types.is_numeric_dtype(safe[column]) and not pd.api.types.is_datetime64_any_dtype(safe[column]):
            safe[column] = safe[column].map(csv_cell)
    safe.columns = [csv_cell(str(c)) for c in safe.columns]
    # CRLF rows, as RFC 4180 has them: a cell holding a bare CR is then quoted too (with "\n" rows it was not, and a
    # spreadsheet read "ok\r=1+1" as a new row starting with a formula)
    safe.to_csv(path, index=False, lineterminator="\r\n")


def number_or_none(value: Any) -> float | None:
    """A figure as a float, or None where it is missing (None, NaN, pandas' NA): a missing value never passes a
    threshold, and evidence leaves it out rather than showing a number."""
    if value is None or pd.isna(value):
        return None
    return float(value)
