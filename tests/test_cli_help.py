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
