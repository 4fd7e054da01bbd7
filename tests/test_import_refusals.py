"""An import that keeps nothing is not a success (issue 45 item 1): every importer fed a file of lines that are no
rows exits 2 with the reason, and sacct's default fixed-width table (what a pasted `$ sacct ... -o ...` shows) is
read where its cells are whole and refused, naming the column, where sacct cut them."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuledger.collector.jobs import JOB_FORMATS, QUEUE_FORMATS
from gpuledger.deploy.trace_import import TRACES
from tests.procs import GPULEDGER

DATA = Path(__file__).parent / "data"
JUNK = "hello world\nsome prose | with a bar\n$ sacct -o JobID,State\nnot a row\n"


def _import(fmt: str, path: Path, db: Path) -> subprocess.CompletedProcess:
    return subprocess.run([GPULEDGER, "import", fmt, str(path), "--db", str(db)], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("fmt", [*JOB_FORMATS, *QUEUE_FORMATS, *TRACES])
def test_every_importer_refuses_a_file_of_no_rows_with_the_reason(fmt, tmp_path):
    junk = tmp_path / "junk.txt"
    junk.write_text(JUNK)
    target = junk
    if fmt in TRACES:  # a trace is a folder of files
        folder = tmp_path / "junk"
        folder.mkdir()
        (folder / "junk.txt").write_text(JUNK)
        target = folder
    out = _import(fmt, target, tmp_path / "j.duckdb")
    assert out.returncode == 2, (fmt, out.stdout, out.stderr)
    assert "error:" in out.stderr and len(out.stderr.split("error:", 1)[1].strip()) > 20, out.stderr


@pytest.mark.parametrize("header", ["JobID|State|AllocTRES", "JOBID|STATE|TRES_PER_NODE"])
def test_a_header_over_lines_that_are_no_jobs_is_refused_not_imported_as_nothing(header, tmp_path):
    fmt = "sacct" if header.startswith("JobID") else "squeue"
    text = tmp_path / "t.txt"
    text.write_text(f"{header}\nhello\n1|COMPLETED|cpu=1\n")
    out = _import(fmt, text, tmp_path / "j.duckdb")
    assert out.returncode == 2 and "nothing imported" in out.stderr, out.stderr
    assert "not_a_row" in out.stderr


def test_sacct_fixed_width_table_is_read_where_its_cells_are_whole(tmp_path):
    db = tmp_path / "w.duckdb"
    out = _import("sacct", DATA / "sacct-fixed-width.txt", db)
    assert out.returncode == 0, out.stderr
    assert "2 GPU jobs" in out.stdout and "2 step" in out.stdout  # 4712.exte+ is still a step
    from gpuledger.analytics.store import Store
    with Store(db) as store:
        jobs = store.query("SELECT job_id, team, state, gpus, name FROM jobs ORDER BY job_id")
    assert jobs.to_dict(orient="list") == {"job_id": ["slurm:4711", "slurm:4712"], "team": ["nlp", "vision"],
                                           "state": ["completed", "out_of_memory"], "gpus": [4, 1],
                                           "name": ["train-llm", "eval-big+"]}


def test_sacct_fixed_width_table_cut_where_the_gpus_are_is_refused_naming_the_column(tmp_path):
    out = _import("sacct", DATA / "sacct-fixed-width-cut.txt", tmp_path / "c.duckdb")
    assert out.returncode == 2
    assert "cuts its AllocTRES column" in out.stderr and "-P" in out.stderr and "AllocTRES%60" in out.stderr
