"""The demo keeps the audit chain whole and says what a re-run discards (issue 41 item 5): a re-run rebuilt the file
silently, and the audit head anchor left from the old file named entries the new log never had, so the next run
logged "audit log truncated" and `gpuledger audit` reported the chain broken for good."""
from __future__ import annotations

from gpuledger.analytics.config import Config
from gpuledger.analytics.store.access import AuditLog, check_audit
from gpuledger.deploy.demo import _fresh_demo_store
from gpuledger.deploy.token_admin import local_entry


def _audited(store, n: int) -> None:
    log = AuditLog(store, flush_every_s=None)
    for i in range(n):
        log.append(local_entry("decide", f"rec-{i}", {"decision": "accept", "by": "alice"}))
    log.close()


def test_a_rerun_names_what_it_discards_and_starts_a_chain_that_checks(tmp_path, monkeypatch):
    monkeypatch.delenv("GPULEDGER_AUDIT_KEY_FILE", raising=False)
    path = tmp_path / "demo.duckdb"
    said: list[str] = []
    first = _fresh_demo_store(path, Config(), echo=said.append)
    _audited(first, 3)
    assert check_audit(first).intact
    first.close()
    assert not said  # a new file discards nothing
    again = _fresh_demo_store(path, Config(), echo=said.append)
    assert len(said) == 1 and "3 decide" in said[0] and "another --db" in said[0], said
    _audited(again, 1)
    check = check_audit(again)
    assert check.intact, check
    again.close()
