"""Help that helps (issue 45 item 7): every command says what it does, and every option and argument says what it
is for. Walks the parser the CLI runs, so a command or option added without words fails here."""
from __future__ import annotations

import argparse
import subprocess

from gpuledger.deploy.cli import build_parser
from tests.procs import GPULEDGER


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("gpuledger",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*path, name))


def test_every_command_has_a_description_and_every_option_a_help():
    gaps = []
    commands = list(_commands(build_parser()))
    assert len(commands) > 20  # the walk reached the subcommands
    for path, parser in commands:
        if not (parser.description or "").strip():
            gaps.append(f"{' '.join(path)}: no description")
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                gaps.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not gaps, "\n".join(gaps)


def test_host_and_port_say_their_default():
    for command in ("serve", "dashboard"):
        out = subprocess.run([GPULEDGER, command, "--help"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0
        text = " ".join(out.stdout.split())
        assert "--host HOST address to serve" in text and "(default 127.0.0.1" in text, text
        assert "(default 8080" in text or "(default 8501" in text, text


def test_each_import_format_has_its_own_help():
    """`import sacct --help` printed every format's help, traces and kube-state-metrics included (issue 45 item 7):
    each format now says only what it reads and takes only its options."""
    sacct = subprocess.run([GPULEDGER, "import", "sacct", "--help"], capture_output=True, text=True, timeout=60)
    assert sacct.returncode == 0
    text = " ".join(sacct.stdout.split())
    assert "sacct -aP" in text and "--timezone" in text and "--fields" in text
    for other in ("kube-state-metrics", "--team-label", "Philly", "--days"):
        assert other not in text, other
    kai = subprocess.run([GPULEDGER, "import", "kai", "x", "--fields", "a"], capture_output=True, text=True,
                         timeout=60)
    assert kai.returncode == 2 and "unrecognized arguments: --fields" in kai.stderr, kai.stderr
