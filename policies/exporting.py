"""The quota plan exported for one scheduler: what `gpuledger emit` writes and the API's export serves.

The plan is one a scheduler can apply as is (quota_plan.py `applicable_plan`): queues for every namespace a team
submits from, no GPU left under no guarantee without saying so, every job shape of the policy window able to start;
else the export is refused (PlanNotApplicable: the CLI's exit 2, the API's 422) naming each model and shortfall."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from gpuledger.analytics.config import Config
from gpuledger.analytics.records import json_safe
from gpuledger.analytics.store import Store
from gpuledger.analytics.windows import utc_now
from gpuledger.policies.emitters import emitter_for
from gpuledger.policies.quota import evaluate_quotas
from gpuledger.policies.quota_plan import applicable_plan
from gpuledger.policies.recommendation import ACCEPTED, OPEN

# which advice an export applies: `accepted` (the default everywhere: a scheduler polling the export must never
# apply a proposal no admin reviewed) or `open` (proposed too, to review what the plan would become)
STATUSES = {"accepted": (ACCEPTED,), "open": OPEN}
DEFAULT_STATUS = "accepted"
FORMATS = ("native", "json")


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


def export(store: Store, config: Config, target: str, status: str = DEFAULT_STATUS, current: str | None = None,
           at: datetime | None = None, fill: bool = False) -> Export:
    """The plan as of `at` (default now) in the target's objects. `fill`: GPUs that advice leaves under no guarantee
    are shared out by share (stated in the header) instead of refusing the plan."""
    at = at or utc_now()
    emitter = emitter_for(target, config.topology)
    plan = applicable_plan(store, config, STATUSES[status], at=at, fill=fill, evidence=[
        a for a in evaluate_quotas(store, config, at) if a.status != "insufficient_data"])
    emitted = emitter.emit(plan, current)
    return Export(target, emitted.text, json.dumps(json_safe(emitted.objects), indent=2) + "\n", emitted.media_type)

