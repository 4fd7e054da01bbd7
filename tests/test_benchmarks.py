"""Every benchmark still starts: its imports resolve and --help explains it (a moved module broke one unnoticed)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).parent.parent / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_a_benchmark_starts_and_explains_itself(script):
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout.lower()


def test_every_benchmark_is_found():
    assert {p.name for p in BENCHMARKS} >= {"analytics.py", "ingest.py", "dcgm_parser.py", "recommend_stability.py",
                                            "replay.py"}
