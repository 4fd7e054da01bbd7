"""Job records to a running server (issue 41 item 2): `POST /v1/jobs` takes what `gpuledger import` reads from a
file, with the same refusals and summary, and `gpuledger import FORMAT FILE --server URL` pushes through it, so a
Slurm site's cron feeds the server that owns the store without stopping it. A batch sent twice is stored once."""
from __future__ import annotations

import subprocess

from gpuledger.analytics.config import Config
from gpuledger.analytics.store.access import Role, create_token
from gpuledger.deploy.server import ApiServer
from tests.helpers import SACCT_SAMPLE, api_client
from tests.procs import GPULEDGER

ADMIN = "t0ken-for-tests"
SACCT = SACCT_SAMPLE


def _jobs(store) -> int:
    return int(store.scalar("SELECT count(*) FROM jobs", {}))


def test_post_jobs_stores_once_refuses_like_the_file_path_and_needs_an_admin(file_store):
    admin = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "text/plain"}
    with api_client(file_store, Config(), token=ADMIN) as client:
        answer = client.post("/v1/jobs", params={"format": "sacct"}, content=SACCT, headers=admin)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["stored"] == 2 and body["skipped"] == {"step": 1}
        assert body["summary"][0].startswith("imported sacct: 2 GPU jobs")
        again = client.post("/v1/jobs", params={"format": "sacct"}, content=SACCT, headers=admin)
        assert again.status_code == 200 and _jobs(file_store) == 2  # the same batch twice: stored once
        junk = client.post("/v1/jobs", params={"format": "sacct"}, content="$ ls\nnothing here\n", headers=admin)
        assert junk.status_code == 422 and "no sacct output found" in junk.json()["detail"]
        assert client.post("/v1/jobs", params={"format": "nosuch"}, content=SACCT, headers=admin).status_code == 422
        _, reader = create_token(file_store, "r", Role.parse("reader"), "test")
        refused = client.post("/v1/jobs", params={"format": "sacct"}, content=SACCT,
                              headers={"Authorization": f"Bearer {reader}", "Content-Type": "text/plain"})
        assert refused.status_code == 403 and _jobs(file_store) == 2
        assoc = client.post("/v1/jobs", params={"format": "sacctmgr"}, headers=admin,
                            content="nlp||root|30|gres/gpu:h100=3\n")
        assert assoc.status_code == 200 and assoc.json()["queues"] == 1


def test_import_server_pushes_to_a_running_server_while_it_holds_the_file(file_store, tmp_path):
    (tmp_path / "sacct.txt").write_text(SACCT)
    server = ApiServer(file_store, Config(), port=0, token=ADMIN)
    url = server.start()
    try:
        pushed = subprocess.run([GPULEDGER, "import", "sacct", str(tmp_path / "sacct.txt"), "--server", url,
                                 "--token", ADMIN], capture_output=True, text=True, timeout=120)
        assert pushed.returncode == 0, pushed.stderr
        assert pushed.stdout.startswith("imported sacct: 2 GPU jobs, ") and url in pushed.stdout, pushed.stdout
        assert _jobs(file_store) == 2
        (tmp_path / "junk.txt").write_text("nothing here\n")
        refused = subprocess.run([GPULEDGER, "import", "sacct", str(tmp_path / "junk.txt"), "--server", url,
                                  "--token", ADMIN], capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "refused (422): no sacct output found" in refused.stderr, refused.stderr
    finally:
        server.stop()
