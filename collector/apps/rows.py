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
_PRINTABLE = re.compile(r"[^\x00-\x1f\x7f]*\Z")

APP_COLUMNS = ["ts", "target", "kind", "service", "instance", "namespace", "pod", "team", "job_id", "figure", "part",
               "le", "value"]


def page_rows(rows: Iterable, at: datetime, target: str, attributor: Attributor, namespace: str | None = None,
              pod: str | None = None, job_id: str | None = None,
              skipped: Counter | None = None) -> pd.DataFrame:
    """The rows of one read page at instant `at` (a row's own timestamp, where the page gives one, wins). Rows whose
    service, identity, namespace or pod could not be a real one are dropped and counted in `skipped`."""
    skipped = skipped if skipped is not None else Counter()
    out = []
    for row in rows:
        ns = row.namespace or namespace
        name = row.pod or pod
        if len(row.service) > MAX_SERVICE or len(row.instance) > MAX_INSTANCE \
                or not _PRINTABLE.match(row.service) or not _PRINTABLE.match(row.instance):
            skipped["bad_service_name"] += 1
            continue
        if (ns is not None and not is_identifier("namespace", ns)) or (name is not None
                                                                       and not is_identifier("pod", name)):
            skipped["bad_pod_name"] += 1
            continue
        job = job_id if job_id and not row.pod else (f"{ns}/{name}" if name and ns else name)
        ts = pd.Timestamp(row.ts_ms, unit="ms", tz="UTC") if row.ts_ms is not None else pd.Timestamp(at)
        out.append((ts, target, row.kind, row.service, row.instance, ns, name,
                    attributor.team_for(namespace=ns) if ns else None, job, row.figure, row.part, row.le, row.value))
    return pd.DataFrame(out, columns=APP_COLUMNS)
