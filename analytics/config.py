"""Site configuration: rate card, team shares and quotas, attribution rules, thresholds.

Everything has a default so the demo runs with no file; a TOML file overrides any part. Each section of
scalar settings is one frozen dataclass named for it (`[waste]` is `WasteConfig`, held as `config.waste`),
whose field names are exactly the file's keys; `SETTINGS` bounds each key by section and field name. A key
that is not a field of its section is refused with the nearest valid one, so a typo such as `idle_minutez`
cannot silently leave the default in force.
"""
from __future__ import annotations

import difflib
import logging
import math
import re
from dataclasses import dataclass, field, fields, replace
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd
import tomllib

from gpuledger.analytics.cost_models import CLOUD_PRICING, COST_MODEL_KINDS, Cloud, CostModel, OnPrem
from gpuledger.analytics.cost_split import IDLE_MODES, IDLE_SCOPES, SHARE_BY
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.database import Retention
from gpuledger.analytics.store.gpu_inventory import REGISTER_WINDOW_S
from gpuledger.analytics.store.gpu_time import MAX_DECLARED_INTERVAL_S
from gpuledger.analytics.store.ingest_screen import MAX_GPUS_PER_NODE
from gpuledger.analytics.store.rollups import DEFAULT_IDLE_UTIL_PCT, MINUTE_DAYS, RAW_DAYS
from gpuledger.collector.apps.figures import FIGURES, SERVER_KINDS
from gpuledger.collector.attribution import Attributor
from gpuledger.collector.errors import GpuledgerError, InputError
from gpuledger.analytics.store.rates import POOL, PROFILE, PoolRule
from gpuledger.analytics.catalogue_config import renamed_rates, site_catalogue
from gpuledger.collector.gpu_catalog import (DEFAULT_RATES, GpuModel, memory_gb, mig_profiles, mig_share,
                                            normalize_model, use_site_models, vgpu_profile, vgpu_share)
from gpuledger.collector.jobs.kube_state import label_key
from gpuledger.collector.topology import CLIQUE_LABEL, SCOPES
from gpuledger.collector.identifiers import check_identifier


log = logging.getLogger(__name__)


class ConfigError(GpuledgerError, ValueError):
    """The config file is missing, not TOML, or has a key or value gpuledger cannot use."""


@dataclass
class TeamConfig:
    share: float
    quota_gpus: int | None = None  # the team's current total quota, for display
    parent: str | None = None  # the department (account) above the team, for hierarchical fairshare and queues
    guarantee: dict[str, float] = field(default_factory=dict)  # current guaranteed GPUs per GPU model
    limit: dict[str, float] = field(default_factory=dict)  # current cap on GPUs per GPU model
    # the Kubernetes namespaces the team submits from (its Kueue LocalQueues); empty: those its work was seen in
    namespaces: tuple[str, ...] = ()


@dataclass
class EmailConfig:
    """Where the weekly report is mailed (`[report.email]`): an SMTP server, who gets the admin report, and
    per team who gets that team's page. Credentials are read from the environment, never from the file."""
    host: str
    port: int = 587
    starttls: bool = True
    sender: str = "gpuledger@localhost"
    username_env: str | None = None  # name of the variable holding the SMTP user
    password_env: str | None = None  # and the password
    admins: tuple[str, ...] = ()
    teams: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # a job owner's address, "{user}" standing for the user as the job records name them (`gpuledger notes --send`);
    # None: no note is mailed to anyone (opt-in)
    owner_address: str | None = None


EMAIL_KEYS = ("host", "port", "starttls", "from", "username_env", "password_env", "admins", "teams", "owner_address")


def _addresses(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(a, str) and re.fullmatch(r"[^@\s]+@[^@\s]+", a)
                                              for a in value):
        raise ConfigError(f"[{where}] must be a list of e-mail addresses, got {value!r}")
    return tuple(value)


def _email(data: Any) -> EmailConfig | None:
    """`[report.email]`, validated; None when the file has none."""
    report = _table("report", data.get("report", {}))
    _known_keys("report", report, ("email",))
    if "email" not in report:
        return None
    email = _table("report.email", report["email"])
    _known_keys("report.email", email, EMAIL_KEYS)
    if not isinstance(email.get("host"), str) or not email["host"]:
        raise ConfigError("[report.email] host (the SMTP server) is required")
    port = email.get("port", 587)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError(f"[report.email] port must be 1 to 65535, got {port!r}")
    if not isinstance(email.get("starttls", True), bool):
        raise ConfigError("[report.email] starttls must be true or false")
    teams = _table("report.email.teams", email.get("teams", {}))
    return EmailConfig(host=email["host"], port=port, starttls=email.get("starttls", True),
                       sender=str(email.get("from", "gpuledger@localhost")),
                       username_env=email.get("username_env"), password_env=email.get("password_env"),
                       admins=_addresses("report.email.admins", email.get("admins", [])),
                       teams={_name("team", t, "[report.email.teams]"): _addresses(f"report.email.teams.{t}", a)
                              for t, a in teams.items()},
                       owner_address=_owner_address(email.get("owner_address")))


def _owner_address(value: Any) -> str | None:
    """`owner_address`: an address with `{user}` in it, once, where the job's owner goes."""
    if value is None:
        return None
    if not isinstance(value, str) or value.count("{user}") != 1 or \
            not re.fullmatch(r"[^@\s]+@[^@\s]+", value.replace("{user}", "u")):
        raise ConfigError(f"[report.email] owner_address must be an e-mail address with {{user}} in it once (like "
                          f"\"{{user}}@example.org\"), got {value!r}")
    return value


FAIRSHARE_ALGORITHMS = ("slurm_classic", "slurm_fair_tree", "kai_time_based")


@dataclass(frozen=True)
class WasteConfig:
    """`[waste]`: what counts as waste (and the idle threshold the rollups count under)."""
    idle_minutes: float = 30.0  # an allocated GPU idle this long is waste
    idle_util_pct: float = DEFAULT_IDLE_UTIL_PCT  # "idle" means utilisation under this
    oversized_mem_fraction: float = 0.25  # peak memory under this share of the card = oversized


@dataclass(frozen=True)
class FairshareConfig:
    """`[fairshare]`: the algorithm and its parameters."""
    algorithm: str = "slurm_classic"  # one of FAIRSHARE_ALGORITHMS
    half_life_days: float = 7.0  # Slurm: PriorityDecayHalfLife
    window_days: float = 7.0  # KAI time-based: windowSize
    k_value: float = 1.0  # KAI time-based: kValue
    kai_half_life_days: float = 0.0  # KAI time-based: halfLifePeriod; 0 = no decay (KAI's default)


@dataclass(frozen=True)
class QuotaConfig:
    """`[quota]`: how quota advice is made and how often it may change."""
    headroom: float = 0.10
    window_days: float = 14.0  # recommendations look at this much history, whatever the caller views
    min_coverage: float = 0.80  # share of the policy window's hours with samples needed before advising
    cooldown_hours: float = 24.0  # no new quota advice for a team and model sooner than this after the last
    max_change: float = 0.25  # one change moves a guarantee by at most this share of its current value
    min_change_gpus: float = 1.0  # smaller changes are not worth a scheduler's churn
    min_change_fraction: float = 0.10
    refresh_minutes: float = 60.0  # stored recommendations are re-evaluated at most this often
    pending_min_wait_minutes: float = 5.0  # a queued job counts as demand once it has waited this long


# the scheduler models a what-if replays the recorded jobs through (policies/whatif): each closed set once
WHATIF_MODELS = ("kueue", "kai", "slurm")
KUEUE_RECLAIM = ("any", "never")  # ClusterQueue preemption.reclaimWithinCohort, as the model supports it


@dataclass(frozen=True)
class WhatIfConfig:
    """`[whatif]`: how recorded jobs are replayed through a scheduler model, and when quota advice is held back
    because its simulated effect harms other teams."""
    model: str = "kueue"  # the model quota advice is simulated with (one of WHATIF_MODELS)
    harm_wait_minutes: float = 30.0  # another team's p95 wait may grow by at most this ...
    harm_wait_fraction: float = 0.25  # ... or this share of it, whichever is larger, before advice is held back
    slurm_fairshare_weight: float = 10000.0  # PriorityWeightFairshare
    slurm_age_weight: float = 1000.0  # PriorityWeightAge
    slurm_max_age_days: float = 7.0  # PriorityMaxAge
    slurm_calc_period_s: float = 300.0  # PriorityCalcPeriod: how often fair-share factors are recomputed
    backfill_depth: float = 500.0  # bf_max_job_test: pending jobs one scheduling pass looks at
    slurm_pass_delay_s: float = 0.0  # a job's end to slurmctld's next scheduling pass (0: at once)
    kueue_reclaim: str = "any"  # reclaimWithinCohort: a team under its nominal quota preempts borrowers
    # the backtest (policies/whatif/backtest.py): a team with this many jobs in the window is judged; its replayed
    # p95 wait under the quotas in force must be within the larger of these of the measured one, or no effect is
    # calibrated and no advice rests on one
    backtest_min_jobs: int = 20
    backtest_minutes: float = 30.0
    backtest_fraction: float = 0.25


@dataclass(frozen=True)
class RetentionConfig:
    """`[retention]`: how long the store keeps each level."""
    raw_days: float = RAW_DAYS  # raw samples are kept this long (and ingest refuses older ones)
    minute_days: float = MINUTE_DAYS  # minute rollups are kept this long; hour rollups forever

    def levels(self) -> Retention:
        """The store's retention (which checks raw_days <= minute_days)."""
        return Retention(self.raw_days, self.minute_days)


@dataclass(frozen=True)
class IngestConfig:
    """`[ingest]`: what one agent may claim (analytics/store/gpu_inventory.py, gpu_time.py). `max_interval_s`: the
    longest sampling interval a push may declare (each row stands for about that long); `register_window_s`: how
    long after a node's first report the GPUs it sends are registered to it (then only an admin adds one);
    `max_gpus_per_node`: GPUs one node may report in a batch and register."""
    max_interval_s: float = MAX_DECLARED_INTERVAL_S
    register_window_s: float = REGISTER_WINDOW_S
    max_gpus_per_node: int = MAX_GPUS_PER_NODE

    def writer_options(self) -> dict[str, float | int]:
        """The ingest writer's keyword arguments."""
        return {"max_interval_s": self.max_interval_s, "register_window_s": self.register_window_s,
                "max_gpus_per_node": int(self.max_gpus_per_node)}


LEDGER_PERIODS = ("month", "week")  # how the ledger cuts time into periods that close (analytics/ledger.py)


@dataclass(frozen=True)
class LedgerConfig:
    """`[ledger]`: the periods a bill closes by. A period closes `grace_days` after its end (late samples and
    corrections to its usage come in meanwhile); from then on its statement is stored and never changes."""
    period: str = "month"
    grace_days: float = 3.0
    idle: str = "own_line"  # idle capacity: its own line, or "shared" to who allocated (analytics/cost_split.py)
    idle_by: str = "cluster"  # shared idle: by allocation across the cluster, or per "node"
    shared_teams: tuple[str, ...] = ()  # teams whose cost is spread over the others (a platform team's GPUs)
    share_by: str = "cost"  # spread by the others' cost, or "even"


@dataclass(frozen=True)
class AlertsConfig:
    """`[alerts]`: when a team is warned about its budget (`warn_at` and `alert_at`: shares of the budget that the
    period's spend, or its forecast at the period's end, crosses), when a job holding GPUs idle is (`idle_hours`),
    how often the server checks (`every_minutes`), and where alerts go: the `[report.email]` server (admins and the
    team's recipients) unless `email = false`, and a `webhook` URL that takes a Slack-compatible JSON body, tried
    `retries` more times when it does not answer."""
    warn_at: float = 0.8
    alert_at: float = 1.0
    idle_hours: float = 4.0
    every_minutes: float = 5.0
    retries: int = 3
    email: bool = True
    webhook: str | None = None


ALERT_NUMBERS = {"warn_at": (0.01, 10.0), "alert_at": (0.01, 10.0), "idle_hours": (0.25, 720.0),
                 "every_minutes": (1.0, 1440.0), "retries": (0.0, 10.0)}


@dataclass(frozen=True)
class RateCard:
    """One dated version of the rate card (`[[rate_cards]]`): the models whose rate changes at `start`, each
    in force until that model's next version. `start` is a whole UTC hour."""
    start: datetime
    rates: dict[str, float]
    variants: dict[tuple[str, str], float] = field(default_factory=dict)  # (model, variant) -> USD/GPU-hour
    variant_basis: dict[tuple[str, str], str] = field(default_factory=dict)  # a MIG profile rate's conversion


@dataclass(frozen=True)
class PlacementConfig:
    """`[placement]`."""
    # teams or namespaces whose jobs are latency-sensitive (inference): they should not share a GPU with others
    latency_sensitive: tuple[str, ...] = ("LS", "inference", "serving")
    # colocate advice (policies/colocation.py): the network bandwidth one GPU has to other nodes, both directions
    # together, GB/s (100: one 400 Gb/s NIC per GPU, as on DGX/HGX H100 boards; a site with less says so here) ...
    network_gbytes_s_per_gpu: float = 100.0
    # ... and the cross-node traffic per GPU (GB/s, PCIe bytes of a job spread over nodes) under which no advice
    colocate_min_gbytes_s_per_gpu: float = 1.0


# what a multi-GPU job is kept inside (`[topology] keep_within`), narrowest first: an NVLink island (GPUs of one node
# joined by NVLink), the node, the multi-node NVLink clique, the rack; declared once, with the topology collector
KEEP_WITHIN = SCOPES
HOSTNAME_LABEL = "kubernetes.io/hostname"  # the node itself: both schedulers' Topology allow it only last
MAX_LEVELS = 16  # the Topology CRDs' maxItems of spec.levels (Kueue's and KAI's alike)


@dataclass(frozen=True)
class TopologyConfig:
    """`[topology]`: where a node sits, as node labels, for Kueue's Topology Aware Scheduling and KAI's topology
    support (policies/emitters/topology.py). A job kept inside one clique or rack talks over NVLink or one switch,
    not across the data centre; the schedulers can only do that when a Topology object names the levels."""
    levels: tuple[str, ...] = (CLIQUE_LABEL, HOSTNAME_LABEL)  # node labels, outermost first, the last the node
    name: str = "gpu-topology"  # the Topology object's name (a Kubernetes name), which flavors and jobs refer to
    scheduler_objects: bool = False  # `emit kueue|kai` also outputs the Topology (and Kueue flavors name it)
    rack_label: str = ""  # the site's node label naming the rack, one of levels; "" = no rack level
    keep_within: str = "island"  # one of KEEP_WITHIN

    def level_label(self, scope: str | None = None) -> str | None:
        """The node label of the level a scope of KEEP_WITHIN (default: keep_within) names, None where the levels
        have none: a scheduler can only keep a job inside a level its Topology lists. An island lies inside one
        node, the narrowest level a Topology has, so it is the node's level (which of the node's GPUs a job gets
        is the device plugin's choice, not the Topology's)."""
        scope = scope or self.keep_within
        if scope == "rack":
            return self.rack_label if self.rack_label and self.rack_label in self.levels else None
        if scope == "clique":
            return CLIQUE_LABEL if CLIQUE_LABEL in self.levels else None
        return self.levels[-1] if self.levels else None  # "node" and "island"


@dataclass(frozen=True)
class EfficiencyConfig:
    """`[efficiency]`: when a job's profiling readings (SM activity, tensor and DRAM activity, interconnect bytes)
    say it is not achieving what its GPU_UTIL suggests. GPU_UTIL is the share of time any kernel ran; SM active is
    the share of the SMs' time spent working, so a job at 100% GPU_UTIL and 5% SM active keeps one SM busy."""
    starved_util_pct: float = 80.0  # busy by GPU_UTIL: a mean at or over this ...
    starved_sm_active: float = 0.30  # ... with SM active under this share: busy but starved
    tensor_idle_max: float = 0.05  # a training job on a tensor-core card with tensor pipes active under this share
    memory_bound_dram: float = 0.60  # DRAM active at or over this share while SM active is under starved_sm_active
    comm_gbps_per_gpu: float = 20.0  # NVLink + PCIe GB/s per GPU at or over which a starved job is comm-bound
    min_coverage: float = 0.5  # the share of a job's GPU-hours with the reading a flag needs; less: no flag, said so


@dataclass(frozen=True)
class Slo:
    """A latency objective (`[slo."name"]`) of a service (the model it serves) or of a team: each bound in seconds,
    None where not set. analytics/inference.py says per service whether it was met."""
    ttft_p95_s: float | None = None
    tpot_p95_s: float | None = None
    e2e_p95_s: float | None = None
    e2e_p99_s: float | None = None


@dataclass(frozen=True)
class AppTarget:
    """An inference server's /metrics endpoint to read (`[[apps.targets]]`), with the pod it runs in (the page's
    own pod labels win, as a page read through Prometheus carries them) or the job it belongs to."""
    url: str
    namespace: str | None = None
    pod: str | None = None
    job_id: str | None = None


@dataclass
class AppsConfig:
    """`[apps]`: where inference servers' metrics are read from, how often, and names a new server version uses."""
    targets: list[AppTarget] = field(default_factory=list)
    interval_s: float = 30.0
    aliases: dict[str, dict[str, str]] = field(default_factory=dict)  # server kind -> {family name: figure}
    triton_ensembles: tuple[str, ...] = ()  # Triton models that are ensembles though their names do not say so


# the file's sections of settings, each the dataclass whose fields are its keys (in the order the loader reads them)
SECTION_TYPES: dict[str, type] = {"placement": PlacementConfig, "waste": WasteConfig, "fairshare": FairshareConfig,
                                  "quota": QuotaConfig, "retention": RetentionConfig, "efficiency": EfficiencyConfig,
                                  "ledger": LedgerConfig, "whatif": WhatIfConfig, "ingest": IngestConfig}


@dataclass
class Config:
    rates: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_RATES))  # in force since ever
    rate_cards: list[RateCard] = field(default_factory=list)  # dated changes, oldest first
    cost_models: list[CostModel] = field(default_factory=list)  # [cost_models]: where rates come from
    # (model, start[, variant]) -> workings
    rate_basis: dict[tuple, str] = field(default_factory=dict)
    variant_rates: dict[tuple[str, str], float] = field(default_factory=dict)  # (model, variant): since ever
    node_pools: list[PoolRule] = field(default_factory=list)  # [node_pools]: which pool a node is in
    # [pool_teams]: pool -> the teams whose jobs its nodes' agents may claim (analytics/store/job_claims.py)
    pool_teams: dict[str, tuple[str, ...]] = field(default_factory=dict)
    teams: dict[str, TeamConfig] = field(default_factory=dict)
    namespace_to_team: dict[str, str] = field(default_factory=dict)
    user_to_team: dict[str, str] = field(default_factory=dict)
    # [slurm_gres]: GPU model -> the GPU type Slurm names its GPUs by (gres.conf Type=), where no sacct record shows it
    slurm_gres: dict[str, str] = field(default_factory=dict)
    waste: WasteConfig = field(default_factory=WasteConfig)
    fairshare: FairshareConfig = field(default_factory=FairshareConfig)
    quota: QuotaConfig = field(default_factory=QuotaConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    efficiency: EfficiencyConfig = field(default_factory=EfficiencyConfig)
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    whatif: WhatIfConfig = field(default_factory=WhatIfConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    budgets: dict[str, float] = field(default_factory=dict)  # team -> USD per ledger period ([budgets])
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    slo: dict[str, Slo] = field(default_factory=dict)  # by service (model served) or team
    apps: AppsConfig = field(default_factory=AppsConfig)
    email: EmailConfig | None = None  # [report.email]: mail the weekly report
    catalogue: list[GpuModel] = field(default_factory=list)  # [catalogue]: the site's own cards (in force once loaded)

    def apply_to(self, store: Store) -> None:
        """Give the store this site's retention, and rollups that count idle under this site's threshold
        (rebuilt from the raw samples kept when the threshold changed)."""
        store.retention = self.retention.levels()
        store.use_idle_threshold(self.waste.idle_util_pct)

    def dated_rates(self) -> list[tuple[str, datetime, float]]:
        """The dated versions as the store keeps them: (GPU model, start, USD per GPU-hour)."""
        return [(model, card.start, rate) for card in self.rate_cards for model, rate in card.rates.items()]

    def variant_rows(self) -> list[tuple[str, datetime | None, float, str]]:
        """The node pools' and MIG profiles' rates: (GPU model, start (None: since ever), USD/GPU-hour, variant)."""
        return ([(m, None, rate, v) for (m, v), rate in self.variant_rates.items()]
                + [(m, card.start, rate, v) for card in self.rate_cards for (m, v), rate in card.variants.items()])

    def price(self, store: Store) -> None:
        """Give the store this site's rate card and node pools (refused where they would re-price a closed period),
        logging what it re-prices of open time."""
        for change in store.set_rates(self.rates, [*self.dated_rates(), *self.variant_rows()], self.rate_basis,
                                      self.node_pools):
            log.warning("rate card changed: %s is re-priced; its periods are not closed yet", change)

    def pue(self) -> float | None:
        """The data centre's PUE, from the first on-premises cost model (None: no such model)."""
        return next((c.model.pue for c in self.cost_models if isinstance(c.model, OnPrem)), None)

    def attributor(self) -> Attributor:
        return Attributor(namespace_to_team=self.namespace_to_team, user_to_team=self.user_to_team)

    def team_frame(self) -> pd.DataFrame:
        """The configured teams as the store's `teams` table holds them."""
        return pd.DataFrame([{"team": t, "share": c.share, "quota_gpus": c.quota_gpus, "parent": c.parent}
                             for t, c in self.teams.items()], columns=["team", "share", "quota_gpus", "parent"])

    def quota_frame(self) -> pd.DataFrame:
        """The configured guarantees and limits per team and GPU model."""
        return pd.DataFrame([{"team": t, "gpu_model": m, "guarantee_gpus": c.guarantee.get(m),
                              "limit_gpus": c.limit.get(m)}
                             for t, c in self.teams.items() for m in sorted(set(c.guarantee) | set(c.limit))],
                            columns=["team", "gpu_model", "guarantee_gpus", "limit_gpus"])



@dataclass(frozen=True)
class Bound:
    """What one key of a section accepts: a number from `minimum` to `maximum`, one of `choices`, or (`names`)
    a list of that kind of name (collector/identifiers.py)."""
    minimum: float = 0.0
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    names: str | None = None


# per section, per field of its dataclass: what the key accepts (tests/test_config.py holds these to the fields)
SETTINGS: dict[str, dict[str, Bound]] = {
    "placement": {"latency_sensitive": Bound(names="namespace"), "network_gbytes_s_per_gpu": Bound(0.1),
                  "colocate_min_gbytes_s_per_gpu": Bound(0.0)},
    "waste": {
        "idle_minutes": Bound(1.0),
        "idle_util_pct": Bound(0.0, 100.0),
        "oversized_mem_fraction": Bound(0.0, 1.0),
    },
    "fairshare": {
        "algorithm": Bound(choices=FAIRSHARE_ALGORITHMS),
        "half_life_days": Bound(0.01),
        "window_days": Bound(0.01),
        "k_value": Bound(0.0),
        "kai_half_life_days": Bound(0.0),
    },
    "quota": {
        "headroom": Bound(0.0),
        "window_days": Bound(1.0),
        "min_coverage": Bound(0.0, 1.0),
        "cooldown_hours": Bound(0.0),
        "max_change": Bound(0.01, 10.0),
        "min_change_gpus": Bound(0.0),
        "min_change_fraction": Bound(0.0, 1.0),
        "refresh_minutes": Bound(0.0),
        "pending_min_wait_minutes": Bound(0.0),
    },
    "efficiency": {
        "starved_util_pct": Bound(0.0, 100.0),
        "starved_sm_active": Bound(0.0, 1.0),
        "tensor_idle_max": Bound(0.0, 1.0),
        "memory_bound_dram": Bound(0.0, 1.0),
        "comm_gbps_per_gpu": Bound(0.0),
        "min_coverage": Bound(0.0, 1.0),
    },
    "ledger": {
        "period": Bound(choices=LEDGER_PERIODS),
        "grace_days": Bound(0.0, 31.0),
        "idle": Bound(choices=IDLE_MODES),
        "idle_by": Bound(choices=IDLE_SCOPES),
        "shared_teams": Bound(names="team"),
        "share_by": Bound(choices=SHARE_BY),
    },
    "whatif": {
        "model": Bound(choices=WHATIF_MODELS),
        "harm_wait_minutes": Bound(0.0),
        "harm_wait_fraction": Bound(0.0),
        "slurm_fairshare_weight": Bound(0.0),
        "slurm_age_weight": Bound(0.0),
        "slurm_max_age_days": Bound(0.01),
        "slurm_calc_period_s": Bound(1.0),
        "backfill_depth": Bound(1.0, 100000.0),
        "slurm_pass_delay_s": Bound(0.0, 3600.0),
        "kueue_reclaim": Bound(choices=KUEUE_RECLAIM),
        "backtest_min_jobs": Bound(1.0, 100000.0),
        "backtest_minutes": Bound(0.0),
        "backtest_fraction": Bound(0.0),
    },
    "ingest": {
        "max_interval_s": Bound(1.0, 86400.0),
        "register_window_s": Bound(0.0, 86400.0 * 30),
        "max_gpus_per_node": Bound(1.0, 4096.0),
    },
    "retention": {
        "raw_days": Bound(1.0),  # raw samples; also the oldest sample ingest accepts
        "minute_days": Bound(1.0),  # minute rollups (idle stretches need them)
    },
}


def section_keys(section: str) -> tuple[str, ...]:
    """The keys the file's `[section]` accepts: the field names of its dataclass."""
    return tuple(f.name for f in fields(SECTION_TYPES[section]))


TEAM_KEYS = ("share", "quota_gpus", "parent", "guarantee", "limit", "namespaces")
ATTRIBUTION_KEYS = ("namespace_to_team", "user_to_team")
SECTIONS = ("catalogue", "rates", "rate_cards", "cost_models", "node_pools", "pool_teams", "pool_rates", "profile_rates",
            "budgets",
            "alerts",
            "teams", "attribution", "report", "slo", "apps", "topology", "slurm_gres",
            *SECTION_TYPES)
APP_TARGET_KEYS = ("url", "namespace", "pod", "job_id")


def _name(kind: str, value: Any, where: str) -> str:
    """A team, department, GPU model, namespace or user name from the file, held to the identifier rule
    (collector/identifiers.py): these names are later written into shell scripts, YAML, HTML, CSV and Markdown,
    so one with syntax in it is refused here, as a ConfigError naming where it was (`where`, e.g. "[rates]")."""
    try:
        return check_identifier(kind, value, where)
    except InputError as exc:
        raise ConfigError(str(exc)) from exc


def _model(value: Any, where: str) -> str:
    """A GPU model as the rate card and quotas key it: the catalogue's name, or for a card the catalogue does not
    know the driver's name (single spaces allowed, e.g. `RTX 6000 Ada`)."""
    return _name("model_name", value, f"[{where}]")


def _number(where: str, key: str, value: Any, minimum: float = 0.0, maximum: float | None = None) -> float:
    """A finite number in bounds: TOML has `nan` and `inf`, which pass every comparison or overflow an int and
    would reach the cost queries (a NaN rate makes every bill NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum:g}" + (f" and <= {maximum:g}" if maximum is not None else "")
        raise ConfigError(f"[{where}] {key} must be a number {bound}, got {value!r}")
    return float(value)


def _value(section: str, key: str, value: Any) -> Any:
    """One key of a section of settings, checked against its bound in SETTINGS."""
    bound = SETTINGS[section][key]
    if bound.choices:
        if value not in bound.choices:
            raise ConfigError(f"[{section}] {key} must be one of {', '.join(bound.choices)}, got {value!r}")
        return value
    if bound.names:
        if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
            raise ConfigError(f"[{section}] {key} must be a list of team or {bound.names} names, got {value!r}")
        return tuple(_name(bound.names, n, f"[{section}] {key}") for n in value)
    return _number(section, key, value, bound.minimum, bound.maximum)


def _per_model(where: str, value: Any) -> dict[str, float]:
    """A table of GPU model -> GPUs (a team's guarantee or limit per model)."""
    return {_model(model, where): _number(where, model, gpus) for model, gpus in _table(where, value).items()}


def _known_keys(where: str, given: Iterable[str], known: Iterable[str]) -> None:
    """Refuse keys outside `known`, naming the nearest valid one."""
    known = list(known)
    for key in given:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ConfigError(f"[{where}] unknown key {key!r}; {hint}(valid: {', '.join(known)})")


def _table(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"[{where}] must be a table, got {value!r}")
    return value


def _names(where: str, value: Any, kind: str) -> dict[str, str]:
    """A table of name -> team (attribution maps); each key a valid `kind` of name and each value a team name."""
    table = _table(where, value)
    bad = {k: v for k, v in table.items() if not isinstance(v, str) or not v}
    if bad:
        raise ConfigError(f"[{where}] values must be team names, got {bad!r}")
    return {_name(kind, k, f"[{where}]"): _name("team", v, f"[{where}] {k}") for k, v in table.items()}


def _start(where: str, value: Any) -> datetime:
    """A rate card's `from`: a TOML date (midnight UTC) or a date-time with its offset, on a whole UTC hour (the
    rollups price by the hour, so a rate cannot start inside one)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value) if "T" in value or " " in value else date.fromisoformat(value)
        except ValueError as exc:
            raise ConfigError(f"[{where}] from must be a date (2026-12-01) or a date-time with its offset "
                              f"(2026-12-01T08:00:00Z), got {value!r}") from exc
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
    if not isinstance(value, datetime):
        raise ConfigError(f"[{where}] from must be a date or a date-time, got {value!r}")
    if value.tzinfo is None:
        raise ConfigError(f"[{where}] from {value.isoformat()} has no offset: give one (Z for UTC), since a bill "
                          "cannot depend on the server's time zone")
    value = value.astimezone(timezone.utc)
    if value.minute or value.second or value.microsecond or value.year < 1971:
        raise ConfigError(f"[{where}] from must be a whole UTC hour after 1970, got {value.isoformat()}")
    return value


def _budgets(table: Mapping[str, Any], config: Config) -> dict[str, float]:
    """`[budgets]`: team = USD per ledger period. A budget for a team the config does not name (under [teams] or as
    an attribution map's team) is refused: it would never be compared with anything."""
    known = set(config.teams) | set(config.namespace_to_team.values()) | set(config.user_to_team.values())
    budgets = {}
    for team, usd in table.items():
        _name("team", team, "[budgets]")
        if team not in known:
            raise ConfigError(f"[budgets] {team}: unknown team; name it under [teams] (or as an attribution map's "
                              f"team) first{f' (known: {sorted(known)})' if known else ''}")
        budgets[team] = _number("budgets", team, usd, minimum=0.01, maximum=1e12)
    return budgets


def _alerts(table: Mapping[str, Any]) -> AlertsConfig:
    """`[alerts]`, each key checked: shares and hours in range, `email` true or false, `webhook` an http(s) URL."""
    _known_keys("alerts", table, [f.name for f in fields(AlertsConfig)])
    values: dict[str, Any] = {}
    for key, (low, high) in ALERT_NUMBERS.items():
        if key in table:
            values[key] = _number("alerts", key, table[key], low, high)
    if "retries" in values:
        values["retries"] = int(values["retries"])
    if not isinstance(table.get("email", True), bool):
        raise ConfigError("[alerts] email must be true or false")
    hook = table.get("webhook")
    if hook is not None and (not isinstance(hook, str) or not re.fullmatch(r"https?://[^\s]+", hook)):
        raise ConfigError(f"[alerts] webhook must be an http:// or https:// URL, got {hook!r}")
    alerts = AlertsConfig(**values, email=table.get("email", True), webhook=hook)
    if alerts.warn_at > alerts.alert_at:
        raise ConfigError(f"[alerts] warn_at ({alerts.warn_at:g}) is above alert_at ({alerts.alert_at:g})")
    return alerts


ON_PREM_KEYS = {"purchase_usd": (0.0, None), "life_years": (0.1, 50.0), "power_w": (0.0, 5000.0),
                "node_power_w": (0.0, 100000.0), "gpus_per_node": (1.0, 1024.0), "usd_per_kwh": (0.0, 100.0),
                "pue": (1.0, 5.0), "node_overhead_usd_per_month": (0.0, None)}
ON_PREM_REQUIRED = ("purchase_usd", "life_years", "power_w")
CLOUD_PRICE_KEYS = {f"{p}_usd_per_hour": p for p in CLOUD_PRICING}


def _cost_model(model: str, spec: Mapping[str, Any], pool: str | None = None) -> CostModel:
    """One `[cost_models."<GPU model>"]` (or its `.pools.<pool>` sub-table): its kind's keys, each checked; the
    price the `pricing` names must be given; `from` as a rate card's."""
    where = f"cost_models.{model}" + (f".pools.{pool}" if pool else "")
    variant = POOL + pool if pool else ""
    spec = dict(spec)
    start = _start(where, spec.pop("from")) if "from" in spec else None
    kind = spec.pop("kind", None)
    if kind not in COST_MODEL_KINDS:
        raise ConfigError(f"[{where}] kind must be one of {', '.join(COST_MODEL_KINDS)}, got {kind!r}")
    if kind == "on_prem":
        _known_keys(where, spec, ON_PREM_KEYS)
        missing = [k for k in ON_PREM_REQUIRED if k not in spec]
        if missing:
            raise ConfigError(f"[{where}] an on-premises cost model needs {', '.join(missing)}")
        values = {k: _number(where, k, v, *ON_PREM_KEYS[k]) for k, v in spec.items()}
        return CostModel(model, OnPrem(**values), start, variant)
    _known_keys(where, spec, ("instance_type", "gpus_per_instance", "pricing", *CLOUD_PRICE_KEYS))
    pricing = spec.get("pricing", "on_demand")
    if pricing not in CLOUD_PRICING:
        raise ConfigError(f"[{where}] pricing must be one of {', '.join(CLOUD_PRICING)}, got {pricing!r}")
    prices = {CLOUD_PRICE_KEYS[k]: _number(where, k, v, 0.0) for k, v in spec.items() if k in CLOUD_PRICE_KEYS}
    if pricing not in prices:
        raise ConfigError(f"[{where}] pricing is {pricing} but {pricing}_usd_per_hour is not given")
    instance = _name("model_name", spec.get("instance_type", "instance"), f"[{where}] instance_type")
    return CostModel(model, Cloud(instance, _number(where, "gpus_per_instance", spec.get("gpus_per_instance"), 1.0,
                                                    1024.0), pricing, prices), start, variant)


def _cost_models(table: Mapping[str, Any]) -> list[CostModel]:
    models = []
    for model, spec in table.items():
        model = _model(model, "cost_models")
        spec = dict(_table(f"cost_models.{model}", spec))
        pools = _table(f"cost_models.{model}.pools", spec.pop("pools", {}))
        if spec:
            models.append(_cost_model(model, spec))
        for pool, pool_spec in pools.items():
            _name("node_pool", pool, f"[cost_models.{model}.pools]")
            models.append(_cost_model(model, _table(f"cost_models.{model}.pools.{pool}", pool_spec), pool))
    return models


def _derive_rates(config: Config, given: set[str]) -> None:
    """Put each cost model's rate on the card: undated into [rates], dated as a version of its start (merged into a
    [[rate_cards]] entry of the same start). A model's rate given twice (in [rates] and by an undated cost model,
    or twice at one start) is refused: which one prices the bill would be a guess."""
    for derived in config.cost_models:
        row = derived.row()
        model, variant = derived.gpu_model, derived.variant
        what = f"{model}'s rate" + (f" in {variant}" if variant else "")
        if derived.start is None:
            rates: dict = config.variant_rates if variant else config.rates
            key: Any = (model, variant) if variant else model
            given_twice = key in rates if variant else model in given  # [rates] holds defaults too: ask the file
            if given_twice:
                raise ConfigError(f"[cost_models.{model}] and [{'pool_rates' if variant else 'rates'}] both set "
                                  f"{what}: keep one, or give the cost model a `from`")
        else:
            same = next((c for c in config.rate_cards if c.start == derived.start), None)
            if same is None:
                config.rate_cards = sorted([*config.rate_cards, RateCard(derived.start, {})], key=lambda c: c.start)
                same = next(c for c in config.rate_cards if c.start == derived.start)
            rates, key = (same.variants, (model, variant)) if variant else (same.rates, model)
            if key in rates:
                raise ConfigError(f"[cost_models.{model}] and a [[rate_cards]] entry both set {what} "
                                  f"from {derived.start:%Y-%m-%d %H:%M} UTC: overlapping dates")
        rates[key] = row["usd_per_gpu_hour"]
        config.rate_basis[(model, derived.start, variant) if variant else (model, derived.start)] = row["basis"]


def _pool_teams(table: Mapping[str, Any], config: Config) -> dict[str, tuple[str, ...]]:
    """`[pool_teams]`: pool = the teams whose jobs the agents on that pool's nodes may bill (a node pool bought by
    one department, a team's own nodes). A row from such a node naming another team is stored as the node's
    unattributed use. The pool must be one a node can be in ([node_pools])."""
    named = {pool for pool, _, _ in config.node_pools}
    by_label = any(label for _, _, label in config.node_pools)
    out: dict[str, tuple[str, ...]] = {}
    for pool, teams in table.items():
        _name("node_pool", pool, "[pool_teams]")
        if pool not in named and not by_label:
            raise ConfigError(f"[pool_teams] {pool}: no node is in that pool; name it under [node_pools.nodes] "
                              "first, or read pools from node labels ([node_pools] labels)")
        if isinstance(teams, str):
            teams = [teams]
        if not isinstance(teams, list) or not teams:
            raise ConfigError(f"[pool_teams] {pool} must be a list of team names, got {teams!r}")
        out[pool] = tuple(_name("team", t, f"[pool_teams] {pool}") for t in teams)
    return out


def _check_pools(config: Config) -> None:
    """A node pool's rate needs a pool a node can be in: one [node_pools.nodes] names, or any, where [node_pools]
    reads pools from node labels."""
    if any(label for _, _, label in config.node_pools):
        return
    named = {pool for pool, _, _ in config.node_pools}
    for model, _, _, variant in config.variant_rows():
        pool = variant[len(POOL):]
        if variant.startswith(POOL) and pool not in named:
            raise ConfigError(f"a rate for {model} in node pool {pool!r}, but no node is in that pool: add it under "
                              f"[node_pools.nodes] ({pool} = [\"node-name-*\"]), or read pools from node labels "
                              "([node_pools] labels)")


_GLOB = re.compile(r"[A-Za-z0-9._:@/+*?\[\]!-]{1,253}")  # a node name's characters and glob's * ? [ ] !
_LABEL = re.compile(r"([A-Za-z0-9.-]{1,253}/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")  # a Kubernetes label key
_PROFILE = re.compile(r"\d+g\.\d+gb")
# a Kubernetes label key as the Topology CRDs take a level's nodeLabel (a lower-case DNS subdomain prefix and '/',
# then a name of at most 63 characters) and a Kubernetes object name (a DNS subdomain), each checked for length too
_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_KEY = re.compile(rf"(?:(?P<prefix>{_SUBDOMAIN})/)?(?P<name>[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)")
_K8S_NAME = re.compile(_SUBDOMAIN)


def is_label_key(value: Any) -> bool:
    """Whether `value` is a Kubernetes label key (what a Topology level's nodeLabel must be)."""
    match = _LABEL_KEY.fullmatch(value) if isinstance(value, str) else None
    return bool(match) and len(match["name"]) <= 63 and len(match["prefix"] or "") <= 253


def is_k8s_name(value: Any) -> bool:
    """Whether `value` is a Kubernetes object name (a DNS subdomain of at most 253 characters)."""
    return isinstance(value, str) and len(value) <= 253 and bool(_K8S_NAME.fullmatch(value))


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a Kubernetes namespace's name (RFC 1123 label)
_GRES_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a gres.conf Type= (sacctmgr reads , and = as syntax)


def is_namespace(value: Any) -> bool:
    """Whether `value` is a Kubernetes namespace's name (a DNS label: lower case, digits and '-', 1-63)."""
    return isinstance(value, str) and bool(_DNS_LABEL.fullmatch(value))


def _namespaces(where: str, value: Any) -> tuple[str, ...]:
    """A team's `namespaces`: a list of Kubernetes namespace names, each once."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ConfigError(f"[{where}] namespaces must be a list of Kubernetes namespace names, got {value!r}")
    out: list[str] = []
    for name in value:
        if not is_namespace(name):
            raise ConfigError(f"[{where}] namespaces: {ascii(name)[:80]} is not a Kubernetes namespace name "
                              f"(lower-case letters, digits and '-', 1-63 characters)")
        if name not in out:
            out.append(name)
    return tuple(out)


def _slurm_gres(table: Mapping[str, Any]) -> dict[str, str]:
    """`[slurm_gres]`: GPU model = the Slurm GPU type its GPUs are named by (`"A100-80GB" = "a100"`)."""
    out = {}
    for model, gres in table.items():
        model = _model(model, "slurm_gres")
        if not isinstance(gres, str) or not _GRES_TYPE.fullmatch(gres):
            raise ConfigError(f"[slurm_gres] {model} must be a Slurm GPU type (letters, digits and _ . -, as "
                              f"gres.conf Type= names it), got {gres!r}")
        out[model] = gres
    return out


def topology_problem(topology: TopologyConfig) -> str | None:
    """What is wrong with a `[topology]` (None: nothing), checked as the schedulers' Topology CRDs would (label keys,
    unique levels, the node's own label only last, at most MAX_LEVELS), so a bad label is refused, never emitted into
    a scheduler object or a job's annotations; and keep_within must name a level the levels have. One rule for the
    file's loader and the emitters (which may be handed a TopologyConfig built in code)."""
    levels = topology.levels
    if not isinstance(levels, tuple) or not 1 <= len(levels) <= MAX_LEVELS:
        return f"levels must be a list of 1 to {MAX_LEVELS} node label keys, outermost first, got {ascii(levels)[:200]}"
    bad = next((level for level in levels if not is_label_key(level)), None)
    if bad is not None:
        return (f"levels: {ascii(bad)[:80]} is not a Kubernetes label key (an optional DNS prefix and '/', then "
                f"letters, digits, '-', '_' and '.'; e.g. \"{CLIQUE_LABEL}\", \"{HOSTNAME_LABEL}\")")
    if len(set(levels)) != len(levels):
        return f"levels must each be named once, got {list(levels)!r}"
    if HOSTNAME_LABEL in levels[:-1]:
        return f"levels: {HOSTNAME_LABEL} names the node, so it can only be the last level"
    if not is_k8s_name(topology.name):
        return (f"name must be a Kubernetes name (lower-case letters, digits, '-' and '.', at most 253), "
                f"got {ascii(topology.name)[:80]}")
    if not isinstance(topology.scheduler_objects, bool):
        return "scheduler_objects must be true or false"
    rack = topology.rack_label
    if rack != "" and not is_label_key(rack):
        return f"rack_label must be a Kubernetes label key, got {ascii(rack)[:80]}"
    if rack and rack not in levels:
        return f"rack_label {rack!r} is not one of levels: add it there, outermost first"
    if topology.keep_within not in KEEP_WITHIN:
        return f"keep_within must be one of {', '.join(KEEP_WITHIN)}, got {ascii(topology.keep_within)[:80]}"
    if topology.level_label() is None:
        needs = "rack_label" if topology.keep_within == "rack" else f"{CLIQUE_LABEL} among levels"
        return f"keep_within = {topology.keep_within!r} needs {needs}"
    return None


def _topology(table: Mapping[str, Any]) -> TopologyConfig:
    """`[topology]`: its keys, then `topology_problem`'s rules."""
    _known_keys("topology", table, [f.name for f in fields(TopologyConfig)])
    levels = table.get("levels", list(TopologyConfig.levels))
    if not isinstance(levels, list):
        raise ConfigError(f"[topology] levels must be a list of node label keys, outermost first, got {levels!r}")
    topology = replace(TopologyConfig(), **{k: v for k, v in table.items() if k != "levels"}, levels=tuple(levels))
    problem = topology_problem(topology)
    if problem:
        raise ConfigError(f"[topology] {problem}")
    return topology


def _node_pools(table: Mapping[str, Any]) -> list[PoolRule]:
    """`[node_pools]`: `labels`, Kubernetes node label keys whose value names a node's pool (read from
    kube-state-metrics' kube_node_labels; the first a node has wins), then `[node_pools.nodes]`, pool = node-name
    globs in order. A node no rule names is in no pool and priced at its model's rate."""
    _known_keys("node_pools", table, ("labels", "nodes"))
    labels = table.get("labels", [])
    if not isinstance(labels, list) or not all(isinstance(k, str) and _LABEL.fullmatch(k) for k in labels):
        raise ConfigError(f"[node_pools] labels must be a list of Kubernetes label keys "
                          f"(cloud.google.com/gke-nodepool), got {labels!r}")
    rules: list[PoolRule] = [(None, None, label_key(k)) for k in labels]
    for pool, globs in _table("node_pools.nodes", table.get("nodes", {})).items():
        _name("node_pool", pool, "[node_pools.nodes]")
        if isinstance(globs, str):
            globs = [globs]
        if not isinstance(globs, list) or not globs or not all(isinstance(g, str) and _GLOB.fullmatch(g)
                                                                for g in globs):
            raise ConfigError(f"[node_pools.nodes] {pool} must be a list of node-name globs (\"gpu-a-*\"), "
                              f"got {globs!r}")
        rules += [(pool, g, None) for g in globs]
    return rules


def _variant_rates(where: str, pools: Any, profiles: Any) -> dict[tuple[str, str], tuple[float, str | None]]:
    """Node pools' rates (pool -> {GPU model = USD/GPU-hour}) and MIG profiles' (GPU model -> {profile = USD per
    instance-hour}, held per GPU-hour of the card's share the profile occupies, with that conversion as basis)."""
    rates: dict[tuple[str, str], tuple[float, str | None]] = {}
    for pool, spec in _table(f"{where} pools", pools).items():
        _name("node_pool", pool, f"[{where}] pools")
        for model, rate in _table(f"{where} pools.{pool}", spec).items():
            rates[(_model(model, f"{where} pools.{pool}"), POOL + pool)] = (
                _number(f"{where} pools.{pool}", model, rate), None)
    for model, spec in _table(f"{where} profiles", profiles).items():
        model = _model(model, f"{where} profiles")
        for profile, rate in _table(f"{where} profiles.{model}", spec).items():
            kind, share = _profile_share(f"{where} profiles.{model}", model, profile)
            usd = _number(f"{where} profiles.{model}", profile, rate)
            rates[(model, PROFILE + profile.lower())] = (
                usd / share, f"{kind} {profile}: ${usd:g}/instance-hour / {share:.4g} of a card = "
                             f"${usd / share:.4f}/GPU-hour")
    return rates


def _profile_share(where: str, model: str, profile: Any) -> tuple[str, float]:
    """A profile's kind (MIG, vGPU) and the share of `model`'s card it occupies: a MIG profile the catalogue lists
    for the card (its compute slices over the card's), or a vGPU profile of that card as its guest's driver names
    it (A100-10C: its framebuffer over the card's). Anything else is refused: it would price nothing."""
    text = str(profile)
    known = [p.name for p in mig_profiles(model)]
    if _PROFILE.fullmatch(text.lower()):
        share = mig_share(model, text)
        if share is not None and (text.lower() in known or not (known or memory_gb(model))):
            return "MIG", share
    elif vgpu_profile(f"GRID {text}") == text.upper() and normalize_model(f"GRID {text}") == model:
        share = vgpu_share(f"GRID {text}")
        if share:
            return "vGPU", share
    raise ConfigError(f"[{where}] {text!r} is not a MIG or vGPU profile of {model}"
                      + (f" (its MIG profiles: {', '.join(known)}; a vGPU profile as its guests name it, "
                         f"like A100-10C)" if known else " (like 1g.10gb or A100-10C)"))


def _rate_cards(value: Any) -> list[RateCard]:
    """`[[rate_cards]]`: each version's `from` and the rates that change then. A version without a start, two with
    the same start (overlapping dates) or a negative rate is refused: a bill is never priced by a guess."""
    if not isinstance(value, list):
        raise ConfigError("[[rate_cards]] must be an array of tables: [[rate_cards]] from = 2026-12-01 H100 = 5.5")
    cards: list[RateCard] = []
    for i, spec in enumerate(value, 1):
        where = f"rate_cards #{i}"
        spec = dict(_table(where, spec))
        if "from" not in spec:
            raise ConfigError(f"[{where}] has no `from`: every dated rate needs the date it starts "
                              "(from = 2026-12-01); undated rates belong in [rates]")
        start = _start(where, spec.pop("from"))
        variants = _variant_rates(where, spec.pop("pools", {}), spec.pop("profiles", {}))
        if not spec and not variants:
            raise ConfigError(f"[{where}] from {start:%Y-%m-%d %H:%M} UTC sets no rate: add GPU model = USD/GPU-hour")
        rates = {}
        for model, rate in spec.items():
            model = _model(model, where)
            rates[model] = _number(where, model, rate)
        same = next((c for c in cards if c.start == start), None)
        if same is not None:
            raise ConfigError(f"[{where}] starts at {start:%Y-%m-%d %H:%M} UTC like an earlier version: overlapping "
                              "dates; put the rates of one start in one [[rate_cards]]")
        cards.append(RateCard(start, rates, {k: v for k, (v, _) in variants.items()},
                              {k: text for k, (_, text) in variants.items() if text}))
    return sorted(cards, key=lambda c: c.start)


def load_config(path: str | Path | None) -> Config:
    """Read a TOML config; unknown sections or keys and bad values raise ConfigError naming the key."""
    config = Config()
    if path is None:
        use_site_models()  # the shipped catalogue alone, whatever an earlier config of this process added
        return config
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {unknown}; expected {sorted(SECTIONS)}")
    try:
        config.catalogue = site_catalogue(data.get("catalogue", {}))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    use_site_models(config.catalogue)  # before the rates: a site's card has its MIG profiles and memory there
    for model, rate in _table("rates", data.get("rates", {})).items():
        model = _model(model, "rates")  # the name first: a bad rate's message then shows a checked name
        config.rates[model] = _number("rates", model, rate)
    config.rates.update({card.name: card.usd_per_gpu_hour for card in config.catalogue
                         if card.usd_per_gpu_hour is not None and card.name not in data.get("rates", {})})
    config.rates.update(renamed_rates(config.rates, set(data.get("rates", {}))))
    config.rate_cards = _rate_cards(data.get("rate_cards", []))
    config.node_pools = _node_pools(_table("node_pools", data.get("node_pools", {})))
    undated = _variant_rates("rates", data.get("pool_rates", {}), data.get("profile_rates", {}))
    config.variant_rates = {k: v for k, (v, _) in undated.items()}
    config.rate_basis.update({(m, None, v): text for (m, v), (_, text) in undated.items() if text})
    for card in config.rate_cards:
        config.rate_basis.update({(m, card.start, v): text for (m, v), text in card.variant_basis.items()})
    config.cost_models = _cost_models(_table("cost_models", data.get("cost_models", {})))
    _derive_rates(config, set(_table("rates", data.get("rates", {}))))
    _check_pools(config)
    config.pool_teams = _pool_teams(_table("pool_teams", data.get("pool_teams", {})), config)
    for team, spec in _table("teams", data.get("teams", {})).items():
        where = f"teams.{team}"
        _name("team", team, "[teams]")
        if not isinstance(spec, dict):
            raise ConfigError(f"[{where}] must be a table with share and quota_gpus")
        _known_keys(where, spec, TEAM_KEYS)
        quota = spec.get("quota_gpus")
        parent = spec.get("parent")
        if parent is not None and (not isinstance(parent, str) or not parent or parent == team):
            raise ConfigError(f"[{where}] parent must be the name of a department other than the team, got {parent!r}")
        if parent is not None:
            _name("department", parent, f"[{where}] parent")
        config.teams[team] = TeamConfig(
            share=_number(where, "share", spec.get("share", 1)),
            quota_gpus=int(_number(where, "quota_gpus", quota)) if quota is not None else None,
            parent=parent,
            guarantee=_per_model(f"{where}.guarantee", spec.get("guarantee", {})),
            limit=_per_model(f"{where}.limit", spec.get("limit", {})),
            namespaces=_namespaces(where, spec.get("namespaces", [])),
        )
        over = {m: g for m, g in config.teams[team].guarantee.items() if g > config.teams[team].limit.get(m, g)}
        if over:
            raise ConfigError(f"[{where}] guarantee above limit for {over}")
    attribution = _table("attribution", data.get("attribution", {}))
    _known_keys("attribution", attribution, ATTRIBUTION_KEYS)
    for key in ATTRIBUTION_KEYS:
        kind = "namespace" if key == "namespace_to_team" else "user"
        getattr(config, key).update(_names(f"attribution.{key}", attribution.get(key, {}), kind))
    config.email = _email(data)
    config.budgets = _budgets(_table("budgets", data.get("budgets", {})), config)
    config.alerts = _alerts(_table("alerts", data.get("alerts", {})))
    config.slo = _slos(_table("slo", data.get("slo", {})))
    config.apps = _apps(_table("apps", data.get("apps", {})))
    config.topology = _topology(_table("topology", data.get("topology", {})))
    config.slurm_gres = _slurm_gres(_table("slurm_gres", data.get("slurm_gres", {})))
    for section in SECTION_TYPES:
        values = _table(section, data.get(section, {}))
        _known_keys(section, values, section_keys(section))
        setattr(config, section, replace(getattr(config, section),
                                         **{key: _value(section, key, v) for key, v in values.items()}))
    try:
        config.retention.levels()
    except ValueError as exc:
        raise ConfigError(f"{path}: [retention] {exc}") from exc
    return config


def _slos(section: dict) -> dict[str, Slo]:
    """`[slo."name"]` tables: a service's (the model it serves, as its server names it) or a team's latency bounds."""
    out = {}
    keys = tuple(f.name for f in fields(Slo))
    for name, spec in section.items():
        where = f'slo."{name}"'
        if not isinstance(spec, dict) or not spec:
            raise ConfigError(f"[{where}] must be a table with at least one of {list(keys)}")
        _known_keys(where, spec, keys)
        out[name] = Slo(**{k: _positive(where, k, v) for k, v in spec.items()})
    return out


def _positive(where: str, key: str, value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
        raise ConfigError(f"[{where}] {key} must be a positive number of seconds, got {value!r}")
    number = _number(where, key, value)
    if number <= 0:
        raise ConfigError(f"[{where}] {key} must be a positive number of seconds, got {value!r}")
    return number


def _apps(section: dict) -> AppsConfig:
    """`[apps]`: targets (each a table with a url, and the pod or job it serves), interval_s and aliases."""
    _known_keys("apps", section, ("targets", "interval_s", "aliases", "triton_ensembles"))
    targets = []
    for i, spec in enumerate(section.get("targets", [])):
        where = f"apps.targets[{i}]"
        if not isinstance(spec, dict) or not isinstance(spec.get("url"), str):
            raise ConfigError(f"[{where}] must be a table with a url")
        _known_keys(where, spec, APP_TARGET_KEYS)
        if not spec["url"].startswith(("http://", "https://")):
            raise ConfigError(f"[{where}] url must be http:// or https://, got {spec['url']!r}")
        for key, kind in (("namespace", "namespace"), ("pod", "pod"), ("job_id", "job_id")):
            if spec.get(key) is not None:
                _name(kind, spec[key], f"[{where}] {key}")
        targets.append(AppTarget(**spec))
    interval = _number("apps", "interval_s", section.get("interval_s", 30.0))
    if interval < 1:
        raise ConfigError(f"[apps] interval_s must be at least 1 second, got {interval!r}")
    aliases = section.get("aliases", {})
    if not isinstance(aliases, dict) or not all(isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
                                                for v in aliases.values()):
        raise ConfigError("[apps.aliases] must map a server kind to a table of family name = figure")
    for kind, names in aliases.items():
        if kind not in SERVER_KINDS:
            raise ConfigError(f"[apps.aliases.{kind}]: no such server; expected one of {list(SERVER_KINDS)}")
        for family, figure in names.items():
            if not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", family):
                raise ConfigError(f"[apps.aliases.{kind}] {family!r}: not a metric name (letters, digits, _ and :)")
            if figure.split("*")[0].strip() not in FIGURES:
                raise ConfigError(f"[apps.aliases.{kind}] {family} = {figure!r}: no such figure; expected one of "
                                  f"{sorted(FIGURES)} (optionally '*scale')")
    ensembles = section.get("triton_ensembles", [])
    if not isinstance(ensembles, list) or not all(isinstance(e, str) and e for e in ensembles):
        raise ConfigError("[apps] triton_ensembles must be a list of Triton model names")
    return AppsConfig(targets=targets, interval_s=interval, aliases={k: dict(v) for k, v in aliases.items()},
                      triton_ensembles=tuple(ensembles))
