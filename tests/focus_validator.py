"""The FinOps Foundation's FOCUS validator (`focus-validator` on PyPI), in a virtual environment of its own.

It pins pandas 2 and numpy 1 (and needs `multimethod<1.11` beside it), which gpuledger's own environment cannot
hold, so the first test that needs it installs it into `.focus-validator/` at the project root (about a minute;
the index must be reachable, as the README's install needs anyway) and later runs reuse it. It reads its list of
currency codes from a path relative to the working directory, so it is run from its own site-packages folder.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / ".focus-validator"
PINS = ["focus-validator==1.0.0", "multimethod<1.11"]


def validator() -> Path:
    """The validator's executable, installed on first use; a failed install fails the test in CI, else skips."""
    exe = HOME / "bin" / "focus-validator"
    if exe.exists():
        return exe
    try:
        subprocess.run([sys.executable, "-m", "venv", str(HOME)], check=True, capture_output=True, timeout=300)
        subprocess.run([str(HOME / "bin" / "pip"), "install", "-q", *PINS], check=True, capture_output=True,
                       timeout=600)
    except (subprocess.SubprocessError, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        message = f"cannot install {' '.join(PINS)}: {exc} {detail.decode(errors='replace')[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return exe


def validate(csv: Path, version: str = "1.0") -> subprocess.CompletedProcess:
    """Run the validator on `csv` against FOCUS `version`'s rules; its console report is in stdout."""
    exe = validator()
    site = next((HOME / "lib").glob("python3*/site-packages"))
    return subprocess.run([str(exe), "--data-file", str(csv.resolve()), "--validate-version", version],
                          cwd=site, capture_output=True, text=True, timeout=600)
