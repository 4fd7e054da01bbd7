"""The access review a regulated site runs each week ("review allocation records, access permissions and capacity
forecasts regularly"): the live API tokens by role, and those that need a look: never used, unused for
UNUSED_DAYS, expiring within EXPIRING_DAYS. Shown on the weekly report's admin page only (team pages and team
e-mail never carry token names); `gpuledger token list` and GET /v1/tokens give the same facts per token."""
from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd

from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import list_tokens

UNUSED_DAYS = 30  # a token no request used for this long is asked about
EXPIRING_DAYS = 14  # a token expiring this soon is named, so it is renewed or let go on purpose
COLUMNS = ["id", "name", "role", "created", "last_used", "expires", "look_at"]


def access_review(store: Store, at: datetime) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(live tokens per role kind, the tokens to look at with why), as of `at`."""
    tokens = list_tokens(store)
    if tokens.empty:
        return pd.DataFrame(columns=["role", "tokens"]), pd.DataFrame(columns=COLUMNS)
    kinds = tokens["role"].str.split(":").str[0]
    by_role = kinds.value_counts().rename_axis("role").reset_index(name="tokens").sort_values("role")
    now = pd.Timestamp(at)
    reasons = []
    for t in tokens.itertuples(index=False):
        last, expires = pd.Timestamp(t.last_used) if pd.notna(t.last_used) else None, t.expires
        why = []
        if last is None:
            why.append("never used")
        elif now - last > timedelta(days=UNUSED_DAYS):
            why.append(f"unused for {(now - last).days} days")
        if pd.notna(expires):
            left = pd.Timestamp(expires) - now
            if left <= timedelta(0):
                why.append("expired (refused; revoke it to tidy the list)")
            elif left <= timedelta(days=EXPIRING_DAYS):
                why.append(f"expires in {max(left.days, 0)} day(s)")
        reasons.append("; ".join(why))
    look = tokens.assign(look_at=reasons)
    look = look[look["look_at"] != ""][COLUMNS].reset_index(drop=True)
    return by_role.reset_index(drop=True), look


__all__ = ["access_review", "UNUSED_DAYS", "EXPIRING_DAYS"]
