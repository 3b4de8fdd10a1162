"""Every flag of every command has help text, and every command's --help says its whole first sentence."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from vramlab.cli.main import COMMANDS, build_parser


def _actions(parser: argparse.ArgumentParser, path: str):
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        yield path, action
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, f"{path} {name}")


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_flag_has_help(command: str) -> None:
    parser, _ = build_parser(command)
    missing = [
        f"{path}: {'/'.join(a.option_strings) or a.dest}"
        for path, a in _actions(parser, f"vramlab {command}")
        if not (a.help or "").strip() or a.help == argparse.SUPPRESS
    ]
    assert not missing, missing


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_description_is_a_whole_sentence(command: str) -> None:
    parser, _ = build_parser(command)
    description = parser.description or ""
    assert description and description.rstrip().endswith((".", ")")), description


def test_demo_help_through_the_installed_command() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "vramlab", "demo", "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0
    head = " ".join(r.stdout.split("\n\n")[1].split())
    assert head.endswith("write the incident report."), head
