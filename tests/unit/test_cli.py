"""The command line, its help, the README and the docs agree.

The subcommands and flags come from argparse itself (:func:`sharedfs.commands.cli.build_parser`); the
README's "Command line" block and docs/cli.md must show exactly that synopsis, and every
``sharedfs COMMAND --flag`` written anywhere in the README or the docs must exist.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sharedfs.commands.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def synopsis(name: str, parser: argparse.ArgumentParser) -> str:
    """``sharedfs NAME [PATH ...] [--json] --job ID ...``: the line the README and the docs show."""
    parts = [f"sharedfs {name}"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:  # a positional
            metavar = action.metavar or action.dest.upper()
            parts.append(f"[{metavar} ...]" if action.nargs == "*" else str(metavar))
            continue
        flag = max(action.option_strings, key=len)
        if action.nargs == 0:
            text = flag
        elif action.choices:
            text = f"{flag} {{{','.join(action.choices)}}}"
        else:
            text = f"{flag} {action.metavar or action.dest.upper()}"
        parts.append(text if action.required else f"[{text}]")
    return " ".join(parts)


def fenced_block_after(text: str, heading: str) -> str:
    section = text.split(f"\n{heading}\n", 1)[1]
    return section.split("```text\n", 1)[1].split("```", 1)[0]


def synopsis_lines(block: str) -> dict[str, str]:
    return {line.split()[1]: line.strip() for line in block.splitlines() if line.startswith("sharedfs ")}


def test_readme_command_line_block_is_exactly_what_argparse_knows() -> None:
    expected = {name: synopsis(name, parser) for name, parser in subcommands().items()}
    shown = synopsis_lines(fenced_block_after(README.read_text(), "## Command line"))
    assert shown == expected


def test_docs_cli_page_shows_the_same_synopsis() -> None:
    expected = {name: synopsis(name, parser) for name, parser in subcommands().items()}
    page = (DOCS / "cli.md").read_text()
    shown = synopsis_lines(fenced_block_after(page, "## Synopsis"))
    assert shown == expected
    for name in expected:  # each command has its own section with an example
        assert f"\n## sharedfs {name}\n" in page, name


def documents() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flag_written_in_the_docs_exists(path: Path) -> None:
    """`sharedfs doctor --cross-node --timeout 60` in prose must be a real flag of that command."""
    commands = subcommands()
    for match in re.finditer(r"sharedfs (status|doctor|locks|env|cleanup|demo)\b([^`\n|]*)", path.read_text()):
        name, rest = match.group(1), match.group(2)
        known = {flag for action in commands[name]._actions for flag in action.option_strings}
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest):
            assert flag in known, f"{path.name}: `sharedfs {name} ... {flag}` is not a flag of {name}: {match.group(0)}"


def run_cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "sharedfs", *args], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_top_level_help_lists_every_command_in_plain_text() -> None:
    text = run_cli("--help")
    for name in subcommands():
        assert re.search(rf"^    {name} +\S", text, re.MULTILINE), f"{name} missing from --help:\n{text}"
    assert "``" not in text and ":func:" not in text and ":class:" not in text  # no raw reST
    assert "sharedfs demo --html report.html" in text  # examples, not only a list


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_argument_of_every_command_has_help(name: str) -> None:
    parser = subcommands()[name]
    for action in parser._actions:
        assert action.help and action.help != argparse.SUPPRESS, f"sharedfs {name}: {action.dest} has no help"
    text = run_cli(name, "--help")
    assert parser.description and parser.description.split()[0] in text
