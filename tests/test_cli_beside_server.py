"""Commands beside a running server (issue 41 item 1, in part): `recommend` and `decide` with --server ask the server
that holds the file (which keeps collecting) instead of failing on its lock, and print what the file path prints."""
from __future__ import annotations

import json
import os
import subprocess

import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.windows import utc_now
from gpuledger.deploy.server import ApiServer
from gpuledger.policies.recommendation import PROPOSED, Recommendation
from tests.procs import GPULEDGER

ADMIN = "t0ken-for-tests"


def test_recommend_and_decide_through_the_server_that_holds_the_file(file_store, tmp_path):
    rec = Recommendation(kind="quota", team="nlp", gpu_model="H100", action={"guarantee_gpus": 3}, evidence={},
                         reason="nlp waits", status=PROPOSED, created=utc_now())
    file_store.add_recommendations(pd.DataFrame([rec.to_row()]))
    server = ApiServer(file_store, Config(), port=0, token=ADMIN)
    url = server.start()
    try:
        # the file is held: the local path refuses, the --server path answers
        held = subprocess.run([GPULEDGER, "recommend", "--db", str(tmp_path / "file.duckdb")], capture_output=True,
                              text=True, timeout=120)
        assert held.returncode == 2 and "lock" in held.stderr.lower(), held.stderr
        asked = subprocess.run([GPULEDGER, "recommend", "--server", url, "--token", ADMIN], capture_output=True,
                               text=True, timeout=300)
        assert asked.returncode == 0, asked.stderr
        answer = json.loads(asked.stdout)
        assert {"generated_at", "recommendations"} <= set(answer)
        decided = subprocess.run([GPULEDGER, "decide", rec.id, "accept", "--by", "alice", "--server", url,
                                  "--token", ADMIN], capture_output=True, text=True, timeout=120)
        assert decided.returncode == 0, decided.stderr
        assert decided.stdout.strip() == f"{rec.id}: accepted by alice (quota nlp H100): nlp waits"
        assert file_store.scalar("SELECT status FROM recommendations WHERE id = ?", [rec.id]) == "accepted"
        unknown = subprocess.run([GPULEDGER, "decide", "abcdef123456", "accept", "--by", "alice", "--server", url,
                                  "--token", ADMIN], capture_output=True, text=True, timeout=120)
        assert unknown.returncode == 2 and "404" in unknown.stderr, unknown.stderr
    finally:
        server.stop()


def test_capacity_through_the_server_prints_what_the_file_path_prints(tmp_path):
    from datetime import timedelta

    from gpuledger.analytics.store import Store
    from tests.helpers import gpu_rows, table
    db = tmp_path / "c.duckdb"
    end = utc_now().replace(minute=0, second=0, microsecond=0)
    with Store(db) as store:
        store.set_rates(Config().rates)
        rows = [gpu_rows("h", g, "H100", 600, step_s=60.0, start=end - timedelta(hours=12), util=40.0 + g,
                         job=f"nlp/{g}", team="nlp") for g in range(2)]
        store.append_samples(table(*rows))
        store.fold()
    asked = ["capacity", "--weeks", "4", "--end", end.isoformat()]
    local = {fmt: subprocess.run([GPULEDGER, *asked, *fmt, "--db", str(db)], capture_output=True, text=True,
                                 timeout=300) for fmt in ((), ("--json",))}
    assert all(out.returncode == 0 for out in local.values()), [o.stderr for o in local.values()]
    with Store(db) as store:
        server = ApiServer(store, Config(), port=0, token=ADMIN, open_reads=True)
        url = server.start()
        try:
            remote = {fmt: subprocess.run([GPULEDGER, *asked, *fmt, "--server", url, "--token", ADMIN],
                                          capture_output=True, text=True, timeout=300)
                      for fmt in ((), ("--json",))}
            # a server with open reads (the demo's) answers a read without a token
            tokenless = subprocess.run([GPULEDGER, *asked, "--server", url], capture_output=True, text=True,
                                       timeout=300, env={k: v for k, v in os.environ.items()
                                                         if k != "GPULEDGER_TOKEN"})
        finally:
            server.stop()
    assert tokenless.returncode == 0 and tokenless.stdout == local[()].stdout, tokenless.stderr
    for fmt in local:
        assert remote[fmt].returncode == 0, remote[fmt].stderr
        assert remote[fmt].stdout == local[fmt].stdout, fmt
    assert "H100" in local[()].stdout


def test_statement_and_focus_export_through_the_server_match_the_file_path(tmp_path):
    from datetime import timedelta

    from gpuledger.analytics.store import Store
    from tests.helpers import gpu_rows, table
    db = tmp_path / "s.duckdb"
    now = utc_now()
    with Store(db) as store:
        store.set_rates(Config().rates)
        began = max(now.replace(day=1, hour=0, minute=0, second=0, microsecond=0), now - timedelta(hours=5))
        rows = [gpu_rows("h", g, "H100", 120, step_s=60.0, start=began, util=33.3 + g / 7, job=f"t{g}/j",
                         team=f"t{g}") for g in range(3)]
        store.append_samples(table(*rows))
        store.fold()
    period = f"{now:%Y-%m}"

    def run(where: list[str], name: str) -> tuple[str, str]:
        shown = subprocess.run([GPULEDGER, "statement", "--period", period, "--draft", "--out",
                                str(tmp_path / name), *where], capture_output=True, text=True, timeout=300)
        assert shown.returncode == 0, shown.stderr
        focus = subprocess.run([GPULEDGER, "export", "focus", "--period", period, "--draft", "--out",
                                str(tmp_path / f"{name}.csv"), *where], capture_output=True, text=True, timeout=300)
        assert focus.returncode == 0, focus.stderr
        # a draft's coverage counts the hours elapsed so far: the one line two runs a moment apart may differ in
        text = "\n".join(line for line in shown.stdout.split("\ncsv:")[0].splitlines()
                         if not line.startswith("coverage:"))
        focus = pd.read_csv(tmp_path / f"{name}.csv").drop(columns=["x_PeriodHours", "x_CoverageNote"],
                                                            errors="ignore")
        return text, focus.to_csv(index=False)

    local = run(["--db", str(db)], "local")
    with Store(db) as store:
        from gpuledger.analytics.store.access import Role, create_token
        _, team_token = create_token(store, "t1-lead", Role.parse("team:t1"), "test")
        server = ApiServer(store, Config(), port=0, token=ADMIN)
        url = server.start()
        try:
            remote = run(["--server", url, "--token", ADMIN], "remote")
            mine = subprocess.run([GPULEDGER, "statement", "--period", period, "--draft", "--out",
                                   str(tmp_path / "mine"), "--server", url, "--token", team_token],
                                  capture_output=True, text=True, timeout=300)
            final = subprocess.run([GPULEDGER, "statement", "--period", period, "--out", str(tmp_path / "x"),
                                    "--server", url, "--token", ADMIN], capture_output=True, text=True, timeout=300)
        finally:
            server.stop()
    assert remote[0] == local[0] and "t0" in local[0]
    assert remote[1] == local[1]
    assert final.returncode == 2 and "add --draft" in final.stderr  # an open period, as the file path says
    # a team token gets its own lines and the shared ones, never another team's
    assert mine.returncode == 0, mine.stderr
    assert "t1 " in mine.stdout and "t0 " not in mine.stdout and "t2 " not in mine.stdout, mine.stdout


def test_emit_through_the_server_writes_the_plan_the_file_path_writes(tmp_path):
    from gpuledger.analytics.store import Store
    from tests.helpers import gpu_rows, table
    db = tmp_path / "e.duckdb"
    with Store(db) as store:
        store.set_rates(Config().rates)
        store.upsert_teams(pd.DataFrame({"team": ["nlp", "vision"], "share": [1.0, 1.0], "quota_gpus": [2, 2]}))
        store.set_team_quotas(pd.DataFrame({"team": ["nlp", "vision"], "gpu_model": ["H100", "H100"],
                                            "guarantee_gpus": [4.0, 4.0], "limit_gpus": [8.0, 8.0]}))
        start = utc_now().replace(second=0, microsecond=0) - pd.Timedelta(hours=2)
        store.append_samples(table(*[gpu_rows("h", g, "H100", 60, step_s=60.0, start=start) for g in range(8)]))
        store.fold()

    def plan(where: list[str], name: str) -> dict[str, list[str]]:
        out = tmp_path / name
        done = subprocess.run([GPULEDGER, "emit", "--target", "slurm", "--out", str(out), *where], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        # the header says when it was made: the one line the two runs may differ in
        return {f.name: [line for line in f.read_text().splitlines() if " made " not in line]
                for f in sorted(out.iterdir())}

    local = plan(["--db", str(db)], "local")
    with Store(db) as store:
        server = ApiServer(store, Config(), port=0, token=ADMIN)
        url = server.start()
        try:
            remote = plan(["--server", url, "--token", ADMIN], "remote")
        finally:
            server.stop()
    assert set(local) == {"slurm.sh", "slurm.json"} and remote == local


def test_whatif_through_the_server_replays_what_the_file_path_replays(tmp_path):
    import re
    from datetime import datetime, timezone

    from gpuledger.analytics.store import Store
    from tests.helpers import gpu_rows, table
    from tests.helpers import SACCT_SAMPLE as SACCT
    db = tmp_path / "w.duckdb"
    with Store(db) as store:
        store.set_rates(Config().rates)
        began = datetime(2026, 12, 1, 8, tzinfo=timezone.utc)
        store.upsert_teams(pd.DataFrame({"team": ["nlp", "vision"], "share": [1.0, 1.0], "quota_gpus": [2, 2]}))
        store.set_team_quotas(pd.DataFrame({"team": ["nlp", "vision"], "gpu_model": ["H100", "H100"],
                                            "guarantee_gpus": [1.0, 1.0], "limit_gpus": [4.0, 4.0]}))
        store.append_samples(table(*[gpu_rows(node, g, "H100", 160, step_s=600.0, start=began)
                                     for node in ("n1", "n2") for g in range(2)]))
        store.fold()
    (tmp_path / "sacct.txt").write_text(SACCT)
    assert subprocess.run([GPULEDGER, "import", "sacct", str(tmp_path / "sacct.txt"), "--db", str(db)],
                          capture_output=True, timeout=120).returncode == 0
    asked = ["whatif", "--end", "2026-12-02T00:00:00+00:00", "--days", "1", "--no-recommendations",
             "--set", "nlp:H100=2/4", "--capacity", "H100=4"]

    def shown(out: subprocess.CompletedProcess) -> str:
        assert out.returncode == 0, out.stderr
        return re.sub(r"\(in [0-9.]+ s\)", "(in _ s)", out.stdout)  # how long the replay took differs

    local = shown(subprocess.run([GPULEDGER, *asked, "--db", str(db)], capture_output=True, text=True, timeout=300))
    with Store(db) as store:
        server = ApiServer(store, Config(), port=0, token=ADMIN)
        url = server.start()
        try:
            remote = shown(subprocess.run([GPULEDGER, *asked, "--server", url, "--token", ADMIN], capture_output=True,
                                          text=True, timeout=300))
        finally:
            server.stop()
    assert "2 jobs replayed" in local and "nlp H100 guarantee" in local, local
    assert remote == local
