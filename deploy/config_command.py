"""`gpuledger config FILE`: read a site config the way `serve` reads it and say what it holds, or why it is
refused (exit 2), without opening a database or starting anything.

Why: a config is read when a server starts, so a mistake showed only as a server that did not come up; and
`serve --config FILE --help` exits before the file is read. An admin checks a change here first.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpuledger.analytics.config import Config, load_config
from gpuledger.collector.gpu_catalog import DEFAULT_RATES


def add_parser(sub: Any) -> None:
    p = sub.add_parser("config", help="check a site config file and say what it holds (exit 2 naming a bad key)",
                       description="Read FILE as `serve --config FILE` would, print what it sets (teams, rates, the "
                                   "site's GPU cards, budgets, alerts, mail) and exit 0, or print the first problem "
                                   "naming its section and key and exit 2. Opens no database.")
    p.add_argument("file", type=Path, help="the TOML config to check")


def summary(config: Config) -> list[str]:
    """What a loaded config sets beyond the defaults, one line per part."""
    changed = {m: r for m, r in config.rates.items() if DEFAULT_RATES.get(m) != r}
    lines = [f"teams: {len(config.teams)}" + (f" ({', '.join(sorted(config.teams))})" if config.teams else ""),
             f"rates: {len(config.rates)} models priced" + (
                 f"; set here: {', '.join(f'{m} ${r:g}' for m, r in sorted(changed.items()))}" if changed else ""),
             f"dated rate cards: {len(config.rate_cards)}; cost models: {len(config.cost_models)}",
             "site GPU cards: " + (", ".join(f"{c.name} ({c.memory_gb} GB, "
                                             f"{'priced' if c.name in config.rates else 'unpriced'})"
                                             for c in config.catalogue) or "none (the shipped catalogue)"),
             f"budgets: {len(config.budgets)}; SLOs: {len(config.slo)}; app targets: {len(config.apps.targets)}",
             "mail: " + (f"{config.email.host}:{config.email.port}, {len(config.email.admins)} admin(s), "
                         f"{len(config.email.teams)} team(s), owner notes "
                         f"{'to ' + config.email.owner_address if config.email.owner_address else 'off'}"
                         if config.email else "none")]
    return lines


def cmd_config(args: argparse.Namespace, _: Config) -> int:
    config = load_config(args.file)  # a ConfigError is the CLI's one line and exit 2
    print(f"{args.file}: valid")
    for line in summary(config):
        print(f"  {line}")
    return 0
