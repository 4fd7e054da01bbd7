"""Bounded parsing (issue 40, item 6): a page with a label of tens of MiB costs the parser about the page, not
~180x the label, and is counted; a TRES count that is not a finite number is no count, never a traceback."""
from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd

from gpuledger.collector.jobs.sacct import gpus_of
from gpuledger.collector.prom_text import MAX_LINE_CHARS, parse

PROBE = r"""
import json, resource, sys
from gpuledger.collector.prom_text import parse
label = "x" * (40 * 1024 * 1024)
page = ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",Hostname="n1"} 50\n'
        + 'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-2",pod="' + label + '"} 7\n'
        + 'DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-3",Hostname="n1"} 60\n')
del label
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = parse(page)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grew_kib": after - before, "samples": len(result.samples), "errors": dict(result.errors)}))
"""


def test_a_forty_mib_label_is_skipped_and_counted_within_a_bounded_memory():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    found = json.loads(out.stdout)
    assert found["samples"] == 2 and found["errors"] == {"line_too_long": 1}
    assert found["grew_kib"] < 200 * 1024, found  # the page is 40 MiB; its parse adds well under 200 MiB


def test_a_long_but_real_line_is_still_read():
    labels = ",".join(f'label_k{i}="{"v" * 40}"' for i in range(200))  # kube_pod_labels with 200 labels: ~11 KiB
    assert len(labels) < MAX_LINE_CHARS
    result = parse(f"kube_pod_labels{{namespace=\"a\",pod=\"b\",{labels}}} 1\n")
    assert len(result.samples) == 1 and not result.errors


def test_a_tres_count_that_is_not_finite_is_no_count():
    assert gpus_of("cpu=4,gres/gpu=inf") == (None, None)
    assert gpus_of("gres/gpu=nan,gres/gpu:a100=2") == (2, "a100")
    assert gpus_of("gres/gpu=1e300")[0] == int(1e300)  # finite: the record check drops it as bad_gpus


def test_five_thousand_team_names_are_two_hundred_series_and_other(tmp_path):
    """Teams beyond the configured ones, the bill's buckets and MAX_TEAM_LABELS in all are one team "other" on
    /metrics: GPUs and cost summed into it (nothing lost from the totals), no ratio invented for it."""
    from datetime import datetime, timedelta, timezone

    from prometheus_client import CollectorRegistry, generate_latest

    from gpuledger.analytics.config import Config, TeamConfig
    from gpuledger.analytics.store import Store
    from gpuledger.deploy.api.live_metrics import MAX_TEAM_LABELS, StoreGauges
    from tests.helpers import gpu_rows, table
    now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    rows = [r for i in range(5000) for r in gpu_rows(f"n{i // 8}", i % 8, "H100", 10, step_s=60.0,
                                                      start=now - timedelta(minutes=30), util=50.0,
                                                      job=f"t{i:04d}/j", team=f"t{i:04d}")]
    with Store(tmp_path / "m.duckdb") as store:
        config = Config(teams={"t4999": TeamConfig(share=1.0)})
        store.set_rates(config.rates)
        store.append_samples(table(rows))
        store.fold()
        registry = CollectorRegistry()
        registry.register(StoreGauges(store, config, clock=lambda: now))
        text = generate_latest(registry).decode()
    allocated = [line for line in text.splitlines() if line.startswith("gpuledger_team_allocated_gpus{")]
    teams = {line.split('team="')[1].split('"')[0] for line in allocated}
    assert len(teams) <= MAX_TEAM_LABELS + 1 and "other" in teams and "t4999" in teams
    total = sum(float(line.rsplit(" ", 1)[1]) for line in allocated)
    assert abs(total - 5000 * 10 / 60) < 1e-6  # 5,000 GPUs each held 10 of the last 60 minutes
    assert not any('team="other"' in line for line in text.splitlines()
                   if line.startswith(("gpuledger_team_sm_active_ratio", "gpuledger_team_fairshare")))


def test_names_from_sacct_follow_the_identifier_rule():
    """A job id, user or account that a shell, a spreadsheet or Markdown would read as syntax: the record with such
    a job id is dropped, such a user is blanked, each counted as bad_name (the agent path refuses the same)."""
    from gpuledger.collector.jobs.sacct import parse_sacct
    header = "JobID|User|State|Submit|Start|End|Account|AllocTRES|ReqTRES|Restarts|NodeList\n"
    text = header + "\n".join([
        "1|=HYPERLINK(\"x\")|COMPLETED|2026-12-01T10:00:00|2026-12-01T10:05:00|2026-12-01T11:00:00|a|gres/gpu=2||0|"
        "gpu-[01-02]",
        "2|alice|COMPLETED|2026-12-01T10:00:00|2026-12-01T10:05:00|2026-12-01T11:00:00|a|gres/gpu=1||0|gpu$(x)",
        "3|bob|COMPLETED|2026-12-01T10:00:00|2026-12-01T10:05:00|2026-12-01T11:00:00|a|gres/gpu=1||0|gpu-03"])
    batch = parse_sacct(text)
    jobs = batch.jobs.set_index("job_id")
    assert pd.isna(jobs.loc["slurm:1", "user"]) and jobs.loc["slurm:1", "node"] == "gpu-[01-02]"
    assert pd.isna(jobs.loc["slurm:2", "node"]) and jobs.loc["slurm:3", "user"] == "bob"
    assert batch.skipped["bad_name"] == 2


def test_a_sacct_file_streamed_in_chunks_gives_what_it_gives_whole():
    """`import sacct` reads a chunk of rows at a time (1 M rows: 0.8 GB peak, was 4.3 GB read whole): chunked, the
    same jobs, events and skip counts as parsing the text whole, the header naming every chunk's fields."""
    from gpuledger.collector.jobs.sacct import parse_sacct, sacct_chunks
    rows = [f"{100 + i}|u{i}|COMPLETED|2026-12-01T10:00:00|2026-12-01T10:05:00|2026-12-01T11:00:00|a|"
            f"gres/gpu={1 + i % 3}||0|gpu-{i:02d}" for i in range(10)]
    text = "\n".join(["$ sacct -a -P -o JobID,User,State,Submit,Start,End,Account,AllocTRES,ReqTRES,Restarts,NodeList",
                      *rows[:4], "100.batch|u0|COMPLETED|||||||0|gpu-00", "not a row", *rows[4:]])
    whole = parse_sacct(text)
    chunks = list(sacct_chunks(text.splitlines(keepends=True), chunk_lines=3))
    assert len(chunks) == 4
    jobs = pd.concat([c.jobs for c in chunks], ignore_index=True)
    assert jobs.to_dict("records") == whole.jobs.to_dict("records")
    assert sum(len(c.events) for c in chunks) == len(whole.events)
    total = sum((c.skipped for c in chunks), start=type(whole.skipped)())
    assert total == whole.skipped and total["step"] == 1 and total["not_a_row"] == 1
