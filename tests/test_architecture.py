"""The rule of docs/architecture.md, held by reading every import (at the top of a module or inside a function):
collector < analytics (its store first) < policies < deploy, each room importing only from rooms below it or
itself, and the dashboard talking to the rest over HTTP (it imports only the collector's plain constants)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RANK = {"collector": 0, "analytics.base": 0.5, "analytics.store": 1, "analytics": 2, "policies": 3, "deploy": 4}
# analytics modules beneath the store: they import only the collector, and the store uses them (time windows,
# JSON-safe records); anything else of analytics reads through the store
BASE = {"gpuledger.analytics.windows", "gpuledger.analytics.records"}
DASHBOARD_MAY_IMPORT = {"gpuledger.dashboard", "gpuledger.collector.samples", "gpuledger.collector.identifiers"}


def room_of(module: str) -> str | None:
    """`gpuledger.analytics.store.access` -> `analytics.store`; None for anything outside gpuledger."""
    parts = module.split(".")
    if parts[0] != "gpuledger" or len(parts) < 2:
        return None
    if ".".join(parts[:3]) in BASE:
        return "analytics.base"
    if parts[1] == "analytics" and len(parts) > 2 and parts[2] == "store":
        return "analytics.store"
    return parts[1]


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every gpuledger import in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("gpuledger")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpuledger"):
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if node.module in ("gpuledger", "gpuledger.analytics")]  # `from gpuledger.analytics import store`
    return found


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("folder", ["collector", "analytics", "policies", "deploy"])
def test_imports_go_one_way(folder):
    wrong = []
    for path in sources(folder):
        here = room_of("gpuledger." + ".".join(path.relative_to(ROOT).with_suffix("").parts))
        for line, module in imports_of(path):
            there = room_of(module)
            if there in RANK and RANK[there] > RANK[here]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({here}) imports {module} ({there})")
    assert not wrong, "imports against collector < analytics.store < analytics < policies < deploy:\n" + \
        "\n".join(wrong)


def test_the_dashboard_talks_only_http():
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {module}" for path in sources("dashboard")
             for line, module in imports_of(path)
             if not any(module == allowed or module.startswith(allowed + ".") for allowed in DASHBOARD_MAY_IMPORT)]
    assert not wrong, "the dashboard reads the API, never the store or the analytics:\n" + "\n".join(wrong)


def test_the_rule_is_checked_on_something():
    """The walk finds the imports it judges (a test that reads nothing would pass on any tree)."""
    assert sum(len(imports_of(p)) for p in sources("deploy")) > 50
    assert room_of("gpuledger.analytics.store.access") == "analytics.store"
    assert room_of("gpuledger.analytics.usage") == "analytics"
