"""An install puts one import root, `gpuledger`, into site-packages and nothing with a generic name."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = {"collector", "analytics", "policies", "deploy", "dashboard"}


def test_the_wheel_holds_only_the_gpuledger_namespace(tmp_path):
    source = tmp_path / "src"  # a copy: building in the checkout would leave build/ and egg-info behind
    for name in ("pyproject.toml", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    for room in ROOMS:
        shutil.copytree(ROOT / room, source / room, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
                            str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp_path.glob("gpuledger-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"gpuledger"}
    assert not any(name == "gpuledger/__init__.py" for name in names)  # a namespace: rooms are its subpackages
    assert {name.split("/")[1] for name in names if name.startswith("gpuledger/")} == ROOMS
    for needed in ("gpuledger/dashboard/app.py", "gpuledger/deploy/gpuledger.example.toml",
                   "gpuledger/analytics/store/ingest_writer.py", "gpuledger/collector/agent/spool.py",
                   "gpuledger/deploy/api/models.py"):
        assert needed in names
    shipped = {f"gpuledger/{path.relative_to(ROOT).as_posix()}" for room in ROOMS
               for path in (ROOT / room).rglob("*.py") if "__pycache__" not in path.parts}
    assert shipped <= set(names), sorted(shipped - set(names))  # every subpackage is listed in pyproject
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "gpuledger = gpuledger.deploy.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_code_imports_only_through_the_root():
    """No module imports a room by its bare folder name (which would work from a checkout only)."""
    bare = []
    for folder in ROOMS | {"tests", "benchmarks"}:
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                words = line.strip().split()
                if len(words) > 1 and words[0] in ("from", "import") and words[1].split(".")[0] in ROOMS:
                    bare.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert bare == []
