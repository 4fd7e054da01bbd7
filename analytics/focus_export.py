"""A period's statement as FOCUS rows: the FinOps Open Cost and Usage Specification that finance tools read.

Written to FOCUS 1.2's columns (1.1 and 1.2 added BillingAccountType, SubAccountType, InvoiceId, the
PricingCurrency columns, ServiceSubcategory, SkuMeter, SkuPriceDetails and the capacity-reservation and
commitment-quantity columns), plus the older names the FinOps Foundation's own validator still checks
(Provider, Publisher, InvoiceIssuer, ResourceID, ChargeType; additive columns are allowed by the specification), plus
gpuledger's own columns under the `x_` prefix the specification reserves for them. One row per statement line
(usage, idle share, shared cost) and per adjustment (ChargeCategory Adjustment, ChargeClass Correction). The
amounts are the statement's cents, so a FOCUS file of a closed period adds up to its statement exactly.
"""
from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pyarrow as pa

from gpuledger.analytics.records import write_csv
from gpuledger.collector.samples import owner_label

FOCUS_VERSION = "1.2"
FORMATS = ("csv", "parquet")
PROVIDER = "gpuledger"  # who provides, publishes and invoices: the cluster's own chargeback
GPU_HOURS = "GPU-Hours"
DECIMALS = ("BilledCost", "EffectiveCost", "ListCost", "ContractedCost", "ConsumedQuantity", "PricingQuantity",
            "ListUnitPrice", "ContractedUnitPrice", "PricingCurrencyContractedUnitPrice",
            "PricingCurrencyEffectiveCost", "PricingCurrencyListUnitPrice", "CommitmentDiscountQuantity")
STAMPS = ("BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd")
COLUMNS = (
    "AvailabilityZone", "BilledCost", "BillingAccountId", "BillingAccountName", "BillingAccountType",
    "BillingCurrency", "BillingPeriodEnd", "BillingPeriodStart", "CapacityReservationId",
    "CapacityReservationStatus", "ChargeCategory", "ChargeClass", "ChargeDescription", "ChargeFrequency",
    "ChargePeriodEnd", "ChargePeriodStart", "CommitmentDiscountCategory", "CommitmentDiscountId",
    "CommitmentDiscountName", "CommitmentDiscountQuantity", "CommitmentDiscountStatus", "CommitmentDiscountType",
    "CommitmentDiscountUnit", "ConsumedQuantity", "ConsumedUnit", "ContractedCost", "ContractedUnitPrice",
    "EffectiveCost", "InvoiceId", "InvoiceIssuerName", "ListCost", "ListUnitPrice", "PricingCategory",
    "PricingCurrency", "PricingCurrencyContractedUnitPrice", "PricingCurrencyEffectiveCost",
    "PricingCurrencyListUnitPrice", "PricingQuantity", "PricingUnit", "ProviderName", "PublisherName", "RegionId",
    "RegionName", "ResourceId", "ResourceName", "ResourceType", "ServiceCategory", "ServiceName",
    "ServiceSubcategory", "SkuId", "SkuMeter", "SkuPriceDetails", "SkuPriceId", "SubAccountId", "SubAccountName",
    "SubAccountType", "Tags",
    # the names the FinOps Foundation's validator (FOCUS 1.0 rules) checks for columns since renamed
    "Provider", "Publisher", "InvoiceIssuer", "ResourceID", "ChargeType",
    # gpuledger's own
    "x_PeriodState", "x_RateCard", "x_LineKind", "x_SharedFrom", "x_Corrects", "x_MadeBy",
    # the period's coverage: hours holding samples over hours of the period (so far), and the note when it is short
    "x_CoveredHours", "x_PeriodHours", "x_CoverageNote")


def _common(found: dict[str, Any], team: str) -> dict[str, Any]:
    """What every row of a statement says: the period, the account (the cluster), the team as its sub-account."""
    return {
        "BillingAccountId": PROVIDER, "BillingAccountName": "GPU cluster", "BillingAccountType": "Cluster",
        "BillingCurrency": "USD", "PricingCurrency": "USD",
        "BillingPeriodStart": found["start"], "BillingPeriodEnd": found["end"],
        "ChargePeriodStart": found["start"], "ChargePeriodEnd": found["end"],
        "InvoiceId": f"{PROVIDER}-{found['period']}", "InvoiceIssuerName": PROVIDER, "InvoiceIssuer": PROVIDER,
        "ProviderName": PROVIDER, "Provider": PROVIDER, "PublisherName": PROVIDER, "Publisher": PROVIDER,
        "ServiceCategory": "Compute", "ServiceName": "GPU compute", "ServiceSubcategory": "Other (Compute)",
        "SubAccountId": team, "SubAccountName": owner_label(team), "SubAccountType": "Team",
        "x_PeriodState": found["state"],
        **({"x_CoveredHours": found["coverage"]["hours_with_data"], "x_PeriodHours": found["coverage"]["hours_elapsed"],
            "x_CoverageNote": found["coverage"]["note"]} if found.get("coverage") else {}),
    }


def _line(found: dict[str, Any], line: dict[str, Any]) -> dict[str, Any]:
    cost, rate, model = line["cost_usd"], line["usd_per_gpu_hour"], line["gpu_model"]
    what = {"usage": "used by", "idle share": "idle capacity shared to", "shared cost": "shared cost spread to"}
    described = (f"{model or 'unknown model'} GPU-hours {what.get(line['kind'], line['kind'])} "
                 f"{owner_label(line['team'])}"
                 + (f" at ${rate:g}/GPU-hour ({line['rate_card']})" if rate is not None else " (unpriced)"))
    tags = {"team": line["team"], "gpu_model": model, "kind": line["kind"], "shared_from": line["shared_from"]}
    return {
        **_common(found, line["team"]),
        "BilledCost": cost, "EffectiveCost": cost, "ListCost": cost, "ContractedCost": cost,
        "PricingCurrencyEffectiveCost": cost, "ChargeCategory": "Usage", "ChargeType": "Usage",
        "ChargeFrequency": "Usage-Based",
        "ChargeDescription": described, "ConsumedQuantity": line["gpu_hours"], "ConsumedUnit": GPU_HOURS,
        "PricingQuantity": line["gpu_hours"], "PricingUnit": GPU_HOURS,
        "PricingCategory": "Standard" if rate is not None else "Other",
        "ListUnitPrice": rate, "ContractedUnitPrice": rate, "PricingCurrencyListUnitPrice": rate,
        "PricingCurrencyContractedUnitPrice": rate,
        "ResourceName": model, "ResourceType": "GPU", "SkuId": model, "SkuMeter": GPU_HOURS,
        "SkuPriceId": f"{model or 'unknown'}@{line['rate_card'] or 'unpriced'}",
        "SkuPriceDetails": json.dumps({"rate_card": line["rate_card"]}) if rate is not None else None,
        "Tags": json.dumps({k: v for k, v in tags.items() if v is not None}),
        "x_RateCard": line["rate_card"], "x_LineKind": line["kind"], "x_SharedFrom": line["shared_from"],
    }


def _adjustment(found: dict[str, Any], adj: dict[str, Any]) -> dict[str, Any]:
    return {
        **_common(found, adj["team"]),
        "BilledCost": adj["usd"], "EffectiveCost": adj["usd"], "ListCost": adj["usd"], "ContractedCost": adj["usd"],
        "PricingCurrencyEffectiveCost": adj["usd"], "ChargeCategory": "Adjustment", "ChargeType": "Adjustment",
        "ChargeClass": "Correction",
        "ChargeFrequency": "One-Time", "ChargeDescription": f"correction of {adj['corrects']}: {adj['reason']}",
        "Tags": json.dumps({"team": adj["team"], "adjustment": adj["id"]}),
        "x_LineKind": "adjustment", "x_Corrects": adj["corrects"], "x_MadeBy": adj["made_by"],
    }


def focus_rows(found: dict[str, Any]) -> pd.DataFrame:
    """A statement (analytics/ledger.py `statement`) as FOCUS rows, every column present (null where it does not
    apply), in COLUMNS order."""
    rows = [_line(found, line) for line in found["lines"]] + [_adjustment(found, a) for a in found["adjustments"]]
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for column in STAMPS:
        frame[column] = pd.to_datetime(frame[column], utc=True)
    for column in DECIMALS:
        frame[column] = pd.to_numeric(frame[column])
    return frame


def write_focus(frame: pd.DataFrame, path: Any, kind: str) -> None:
    """FOCUS rows as CSV (date-times as ISO 8601 in UTC with Z; text cells neutralised as every gpuledger CSV is,
    since an adjustment's reason is free text and finance opens these in spreadsheets) or Parquet (timestamps in
    UTC, decimals as doubles, text as strings)."""
    if kind == "parquet":
        table = pa.Table.from_pandas(frame, preserve_index=False)
        import pyarrow.parquet as pq
        pq.write_table(table, path)
        return
    out = frame.copy()
    for column in STAMPS:
        out[column] = out[column].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    write_csv(out, path)
