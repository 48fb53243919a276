"""The README is a front door: short, and every command and link in it works."""

from __future__ import annotations

import re
import shlex

import click
import pytest
import typer
from typer.testing import CliRunner

from ctxext.cli.commands import app
from tests.helpers import ROOT

README = ROOT / "README.md"
MAX_README_LINES = 250


def _bash_commands(markdown: str) -> list[str]:
    """Every command line of the ```bash blocks, with continuation lines joined and comments dropped."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", markdown, flags=re.M | re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            tokens = shlex.split(line, comments=True)
            if tokens:
                commands.append(" ".join(shlex.quote(t) for t in tokens))
    return commands


def _ctxext_commands(markdown: str) -> list[list[str]]:
    return [tokens for c in _bash_commands(markdown) if (tokens := shlex.split(c))[0] == "ctxext"]


def _subcommand(tokens: list[str]) -> list[str]:
    """The command path a README line names (``["eval", "run"]``); fails the test for an unknown one."""
    # Groups list their commands (typer vendors its own click, so no isinstance check against click's classes);
    # `eval` generates one per registered suite section when asked (list_commands / get_command).
    command = typer.main.get_command(app)
    path: list[str] = []
    for token in tokens[1:]:
        if not hasattr(command, "list_commands") or token.startswith("-"):
            break
        ctx = click.Context(command)
        subcommands = command.list_commands(ctx)
        assert token in subcommands, f"README: `{' '.join(tokens)}`: `{token}` is not a ctxext subcommand"
        command, path = command.get_command(ctx, token), [*path, token]
    assert path, f"README: `{' '.join(tokens)}` names no subcommand"
    assert not hasattr(command, "list_commands"), f"README: `{' '.join(tokens)}`: `{' '.join(path)}` needs a subcommand"
    return path


def test_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md: {lines} lines (at most {MAX_README_LINES}); move detail into docs/"


def test_readme_keeps_the_two_commands() -> None:
    commands = _bash_commands(README.read_text())
    assert "bash scripts/demo.sh" in commands and "bash scripts/test.sh" in commands


def _check_commands(markdown: str) -> None:
    """Each ``ctxext`` line names a real subcommand, and each of its ``--flags`` is in that command's help."""
    commands = _ctxext_commands(markdown)
    runner = CliRunner()
    helps: dict[tuple[str, ...], str] = {}
    for tokens in commands:
        path = tuple(_subcommand(tokens))
        if path not in helps:
            # A wide terminal, so that rich never cuts a flag's name in the help table.
            result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "400", "NO_COLOR": "1"})
            assert result.exit_code == 0, result.output
            helps[path] = result.output
        for flag in (t.split("=", 1)[0] for t in tokens if t.startswith("--")):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps[path]), (
                f"README: `{' '.join(tokens)}`: `ctxext {' '.join(path)}` has no flag {flag}"
            )


def test_readme_ctxext_commands_name_real_subcommands_and_flags() -> None:
    markdown = README.read_text()
    subcommands = {_subcommand(tokens)[0] for tokens in _ctxext_commands(markdown)}
    journey = {"inspect", "extend", "search", "plan", "train", "eval", "merge", "push"}
    assert journey <= subcommands, f"the README's journey misses {sorted(journey - subcommands)}"
    _check_commands(markdown)


def test_readme_relative_links_exist() -> None:
    text = README.read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    relative = [t for t in targets if not re.match(r"[a-z]+:|#", t)]
    assert relative, "the README links into docs/"
    missing = [t for t in relative if not (ROOT / t.split("#", 1)[0]).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("ctxext extnd ./llama --out x", "not a ctxext subcommand"),
        ("ctxext extend ./llama --target-lenght 256", "has no flag --target-lenght"),
        ("ctxext eval --model x", "needs a subcommand"),
    ],
)
def test_the_readme_check_catches_a_wrong_command(line: str, problem: str) -> None:
    with pytest.raises(AssertionError, match=problem):
        _check_commands(f"text\n```bash\nctxext methods\n{line}   # a comment\n```\n")
