"""Analytics results as JSON-safe records, for the API, the CLI and stored evidence.

DataFrames carry numpy scalars, pandas timestamps and NaN, none of which JSON takes.
"""
from __future__ import annotations

import math
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
