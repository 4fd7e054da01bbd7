"""The quota plan exported for one scheduler: what `gpuledger emit` writes and the API's export serves."""
from __future__ import annotations

import json
from dataclasses import dataclass

from gpuledger.analytics.config import Config
from gpuledger.analytics.records import json_safe
from gpuledger.analytics.store import Store
from gpuledger.analytics.windows import utc_now
from gpuledger.policies.emitters import emitter_for
from gpuledger.policies.quota import evaluate_quotas
from gpuledger.policies.quota_plan import build_plan
from gpuledger.policies.recommendation import ACCEPTED, OPEN

STATUSES = {"accepted": (ACCEPTED,), "open": OPEN}


@dataclass
class Export:
    target: str
    native: str  # YAML, or the sacctmgr script
    json: str
    media_type: str

    def __getitem__(self, fmt: str) -> str:
        return self.native if fmt == "native" else self.json

    def named(self) -> dict[str, str]:
        """File name -> contents, as `emit --out` writes them."""
        if self.target == "slurm":
            return {"slurm.sh": self.native, "slurm.json": self.json}
        return {f"{self.target}.yaml": self.native}


def export(store: Store, config: Config, target: str, status: str = "open", current: str | None = None) -> Export:
    emitter = emitter_for(target)
    plan = build_plan(store, config, STATUSES[status], evidence=[
        a for a in evaluate_quotas(store, config, utc_now()) if a.status != "insufficient_data"])
    emitted = emitter.emit(plan, current)
    return Export(target, emitted.text, json.dumps(json_safe(emitted.objects), indent=2) + "\n", emitted.media_type)

