"""The soak benchmark at a small scale: agents push while the dashboard's calls run, then the faults (kill -9 in a
group commit, a full database disk, a jumping clock, an older agent's batches); every row is accounted for."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

SOAK = Path(__file__).parent.parent / "benchmarks" / "soak.py"


def test_soak_loses_and_duplicates_nothing_under_load_and_faults(capsys):
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    soak = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = soak  # its dataclasses look their module up
    spec.loader.exec_module(soak)
    report = soak.main(["--nodes", "16", "--seconds", "4", "--readers", "2", "--fault-seconds", "3", "--small"])
    shown = capsys.readouterr().out
    accounting = report["accounting"]
    phases = {k: v for k, v in accounting.items() if not k.startswith("_")}
    assert set(phases) >= {"ingest alone", "ingest + readers", "kill -9 in a group commit", "clock jumps",
                           "older agent's batches"}
    for phase, row in phases.items():
        assert row["lost"] == 0 and row["duplicated"] == 0, (phase, row)
        assert row["stored"] == row["rows_sent"] - row.get("refused", 0), (phase, row)
    assert phases["clock jumps"]["refused"] > 0  # the node 2 h ahead of the server's clock
    assert all(row.get("refused", 0) == 0 for phase, row in phases.items() if phase != "clock jumps")
    old = report["faults"]["older agent's batches"]
    assert accounting["_old_format_rows_with_nulls"]["rows"] == int(old.split()[0]) > 0
    assert report["reads"]["count"] > 0 and report["reads"]["failed"] == 0
    if os.geteuid() == 0:  # the database sat on a tmpfs the benchmark filled
        assert "pushes answered 503" in report["faults"]["database disk full"]
        assert int(report["faults"]["database disk full"].split()[0]) > 0
    assert "lost" in shown and "x baseline" in shown
    attacks = report["attacks"]  # issue 21: each refused without the memory it asked for, /healthz answering
    assert attacks["decompression bomb"]["outcome"].split(": ", 1)[1].startswith("422 unpacked size")
    assert all(row["peak_mib"] - row["peak_before_mib"] < 160 and row["healthz_failed"] == 0
               for row in attacks.values()), attacks
    assert "64 still open" in attacks["half-header flood"]["outcome"]
