"""An inference server's page, as read (collector/apps reading.py), into the rows the store keeps (`app_samples`).

Why here: every way a page arrives (a scrape of a configured target, a pod found by its annotations, Prometheus,
the simulator) attributes it the same way: the pod and namespace the page's own labels name (a page read through
Prometheus carries them), else those of the target it was read from; the team from the namespace by the site's
attribution rules; the job is `namespace/pod`, as the GPU samples of a Kubernetes pod name it, unless the target
names its job (a Slurm job serving a model).
"""
from __future__ import annotations

import re
from collections import Counter
from datetime import datetime
from typing import Iterable

import pandas as pd

from gpuledger.collector.attribution import Attributor
from gpuledger.collector.identifiers import is_identifier

# a service (a model's name as its server writes it: `meta-llama/Llama-3.1-8B-Instruct`, a path, a Triton model
# name) and an instance's identity are free text from the page: bounded and printable, else the row is dropped and
# counted; wherever they are written (HTML, CSV, YAML) they are escaped there
MAX_SERVICE, MAX_INSTANCE = 256, 512
# what one page may store: a real server serves a handful of models (vLLM with many LoRA adapters: hundreds) and a
# 2,000-series vLLM page gives ~7,000 rows; a page past these (one hostile or broken target) keeps the first ones
# and says how many it dropped, so it cannot flood the store and every answer read from it
MAX_SERVICES_PER_PAGE, MAX_ROWS_PER_PAGE = 500, 50_000
_PRINTABLE = re.compile(r"[^\x00-\x1f\x7f]*\Z")

APP_COLUMNS = ["ts", "target", "kind", "service", "instance", "namespace", "pod", "team", "job_id", "figure", "part",
               "le", "value"]


def screened(rows: Iterable, skipped: Counter) -> list:
    """The rows of one page that can be stored: names a real server could give (bounded, printable, real pod and
    namespace names) and at most MAX_SERVICES_PER_PAGE services and MAX_ROWS_PER_PAGE rows; the rest counted by
    reason in `skipped`. `gpuledger scrape` and the servers' loop both screen with this, so a check says what a
    server would store."""
    kept, services = [], set()
    for row in rows:
        if len(row.service) > MAX_SERVICE or len(row.instance) > MAX_INSTANCE \
                or not _PRINTABLE.match(row.service) or not _PRINTABLE.match(row.instance):
            skipped["bad_service_name"] += 1
        elif (row.namespace is not None and not is_identifier("namespace", row.namespace)) \
                or (row.pod is not None and not is_identifier("pod", row.pod)):
            skipped["bad_pod_name"] += 1
        elif (row.kind, row.service) not in services and len(services) >= MAX_SERVICES_PER_PAGE:
            skipped["too_many_services_on_page"] += 1
        elif len(kept) >= MAX_ROWS_PER_PAGE:
            skipped["too_many_rows_on_page"] += 1
        else:
            services.add((row.kind, row.service))
            kept.append(row)
    return kept


def page_rows(rows: Iterable, at: datetime, target: str, attributor: Attributor, namespace: str | None = None,
              pod: str | None = None, job_id: str | None = None,
              skipped: Counter | None = None) -> pd.DataFrame:
    """The rows of one read page at instant `at` (a row's own timestamp, where the page gives one, wins). Rows whose
    service, identity, namespace or pod could not be a real one are dropped and counted in `skipped`."""
    skipped = skipped if skipped is not None else Counter()
    if (namespace is not None and not is_identifier("namespace", namespace)) \
            or (pod is not None and not is_identifier("pod", pod)):
        skipped["bad_pod_name"] += 1
        return pd.DataFrame(columns=APP_COLUMNS)
    out = []
    for row in screened(rows, skipped):
        ns = row.namespace or namespace
        name = row.pod or pod
        job = job_id if job_id and not row.pod else (f"{ns}/{name}" if name and ns else name)
        ts = pd.Timestamp(row.ts_ms, unit="ms", tz="UTC") if row.ts_ms is not None else pd.Timestamp(at)
        out.append((ts, target, row.kind, row.service, row.instance, ns, name,
                    attributor.team_for(namespace=ns) if ns else None, job, row.figure, row.part, row.le, row.value))
    return pd.DataFrame(out, columns=APP_COLUMNS)
