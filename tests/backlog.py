"""A store holding a large unfolded backlog, as a crash in the middle of a fold, a large import or agents draining
an outage leave one: samples written straight into the table, so nothing folds them on the way in."""
from __future__ import annotations

from datetime import datetime
from pathlib import Path

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store

TEAMS = ("nlp", "vision", "speech")


def backlog_store(path: Path, end: datetime, days: float, nodes: int = 16, gpus_per_node: int = 8,
                  step_s: int = 60) -> int:
    """Writes `days` of samples ending at `end` for nodes x gpus_per_node H100s (a third free, the rest held by
    jobs of three teams at varying utilisation) without folding any; returns the rows written."""
    steps = int(days * 86400 // step_s)
    with Store(path) as store:
        store.set_rates(Config().rates)
        with store.transaction() as cur:
            cur.execute(f"""
                INSERT INTO samples BY NAME
                SELECT $end - to_seconds(({steps} - s) * {step_s}) AS ts, {step_s}::DOUBLE AS interval_s,
                       'node-' || n AS node, g::INTEGER AS gpu_index, 'GPU-' || n || '-' || g AS gpu_uuid,
                       'H100' AS gpu_model, 'NVIDIA H100 80GB HBM3' AS model_name, 1.0 AS gpu_fraction,
                       (n * 8 + g) % 3 <> 0 AS allocated,
                       ((s * 7 + n * 13 + g * 29) % 100)::DOUBLE AS util_pct,
                       2000.0 + (g * 1000) AS mem_used_mib, 81559.0 AS mem_total_mib,
                       CASE WHEN (n * 8 + g) % 3 <> 0 THEN 'job-' || n || '-' || (s // 240) END AS job_id,
                       CASE WHEN (n * 8 + g) % 3 <> 0 THEN $teams[1 + (n % 3)] END AS team,
                       'test' AS source
                FROM range({steps}) t(s), range({nodes}) a(n), range({gpus_per_node}) b(g)""",
                        {"end": end, "teams": list(TEAMS)})
        return int(store.scalar("SELECT count(*) FROM samples"))
