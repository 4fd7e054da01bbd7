"""The documentation site (docs/, MkDocs): it builds with `--strict` (a broken link or anchor, or a page missing from
the navigation, fails), its reference pages are what the code generates today (a command, route, config key or metric
added without them fails here), and the README stays a short, true map whose every link resolves."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuledger.deploy.reference_docs import PAGES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict -f docs/mkdocs.yml` run from `root`, as the docs say to run it (MkDocs 1.6 refuses a
    docs_dir equal to the config's folder when the config is given by an absolute path, not by a relative one)."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "docs/mkdocs.yml", "-d",
                           str(site)], capture_output=True, text=True, timeout=300, cwd=root,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly(tmp_path):
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The check above can fail: the same site with one link to a missing anchor does not build."""
    import shutil
    copy = tmp_path / "docs"
    shutil.copytree(DOCS, copy, ignore=shutil.ignore_patterns("screenshots"))
    (copy / "screenshots").mkdir()
    page = copy / "quickstart.md"
    page.write_text(page.read_text() + "\nSee [nowhere](howto/ledger.md#no-such-heading).\n")
    done = _build(tmp_path, tmp_path / "site")
    assert done.returncode != 0 and "no-such-heading" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("name", sorted(PAGES))
def test_each_reference_page_is_what_the_code_generates(name):
    committed = (DOCS / "reference" / name).read_text()
    assert PAGES[name]() == committed, (f"docs/reference/{name} is behind the code: run "
                                        "`python -m gpuledger.deploy.reference_docs docs/reference`")


def test_every_command_route_and_key_is_in_the_reference():
    """What the generated pages must hold, counted from the sources themselves (not from the generator)."""
    from gpuledger.analytics.config import SETTINGS
    from gpuledger.deploy.cli import COMMANDS
    cli, config = (DOCS / "reference" / "cli.md").read_text(), (DOCS / "reference" / "config.md").read_text()
    assert all(f"## gpuledger {command}" in cli for command in COMMANDS)
    assert all(f"`{key}`" in config for keys in SETTINGS.values() for key in keys)
    api = (DOCS / "reference" / "api.md").read_text()
    for route in re.findall(r'@router\.(?:get|post|put|delete)\("([^"]+)"', "".join(
            p.read_text() for p in (ROOT / "deploy" / "api").glob("*.py"))):
        assert f"`{route}`" in api, route


def _slug(heading: str) -> str:
    """GitHub's (and the site's, pymdownx.slugs) anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text, fence, found = page.read_text(), False, set()
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            found.add(_slug(line.lstrip("#")))
    return found


def test_the_readme_is_short_and_every_link_resolves():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert len(links) > 20
    for link in links:
        if link.startswith("http"):
            continue
        target, _, anchor = link.partition("#")
        path = ROOT / target if target else ROOT / "README.md"
        assert path.exists(), link
        if anchor:
            assert anchor in _anchors(path), link
    # the two commands are there, as .ci/run runs the second
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = ".venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest"
    assert test_command in readme and test_command in ci
    assert ".venv/bin/gpuledger demo" in readme


RUNNABLE = "<!-- runnable on the demo"


def _runnable_lines() -> list[tuple[str, str]]:
    """(page, command line) of every fenced block marked runnable in the README and the docs."""
    found = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith(RUNNABLE):
                assert lines[i + 1].startswith("```sh"), f"{page}: a runnable mark must precede a ```sh block"
                for command in lines[i + 2:]:
                    if command.startswith("```"):
                        break
                    if command.strip():
                        found.append((str(page.relative_to(ROOT)), command))
    return found


def test_the_commands_marked_runnable_run_as_written_on_the_demo(tmp_path):
    """The fenced commands a page marks runnable, each line run as a user pastes it (bash, from a folder holding the
    demo's database where `gpuledger demo` leaves it, `gpuledger` and `.venv/bin/gpuledger` both this install's)."""
    from gpuledger.analytics.config import Config
    from gpuledger.deploy.demo import DEMO_MARK, build_demo_store
    from gpuledger.analytics.store import Store
    from tests.procs import GPULEDGER
    commands = _runnable_lines()
    assert len(commands) >= 8, commands
    db = tmp_path / "gpuledger-data" / "demo.duckdb"
    db.parent.mkdir()
    seeded = Store(db)
    seeded.set_meta(DEMO_MARK, "true")
    seeded.close()
    # the demo's cluster and teams, three days of it at 30-minute samples (the commands run the same on 14 days; the
    # build is what takes time: 7 s here against 30 s)
    store, _ = build_demo_store(db, Config(), 3.0, 7, 1800.0, echo=lambda *_: None)
    store.close()
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "gpuledger").symlink_to(GPULEDGER)
    env = {k: v for k, v in os.environ.items() if k not in ("GPULEDGER_SERVER", "GPULEDGER_TOKEN")}
    env["PATH"] = f"{Path(GPULEDGER).parent}:{env.get('PATH', '')}"
    from tests.browser import HAVE_CHROMIUM
    failed = []
    for page, command in commands:
        if "--pdf" in command and not HAVE_CHROMIUM and not os.environ.get("CI"):
            continue  # a PDF needs Debian's chromium, which CI installs
        done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)
        if done.returncode != 0 and not (done.returncode == 141 and "| head" in command):  # head closing a pipe
            failed.append(f"{page}: {command}\n{done.stderr[-1500:]}")
    assert not failed, "\n\n".join(failed)
