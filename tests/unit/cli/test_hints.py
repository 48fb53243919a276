"""Advice that works: every flag a message suggests exists on the command the user is running (or names).

Two nets. Statically, every string in ``ctxext/`` that spells a command (``ctxext extend … --relative-to``)
is checked against that command's options. Dynamically, real bad invocations are run and every flag in
what they print — outside the ``ctxext CMD …`` spans, which are checked against their own command — must
be an option of the command that printed it: a helper shared by several commands (the output checks, the
RoPE planner) must not hand one command's advice to another.
"""

from __future__ import annotations

import ast
import functools
import re
from typing import Any

import click
import pytest
import typer
from typer.testing import CliRunner

from ctxext.cli.commands import app
from tests.helpers import ROOT
from tests.helpers.train import write_fake_run

runner = CliRunner()
CLI: Any = typer.main.get_command(app)  # typer's own click group (typer may vendor click)


def _subcommands(group: Any) -> dict[str, Any]:
    """A group's commands by name, as it lists them (``eval`` generates one per registered suite section)."""
    if not hasattr(group, "list_commands"):
        return {}
    ctx = click.Context(group)
    return {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}


# Every command a user can run: top-level ones and the subcommands of groups (`eval ppl`, `tasks export`).
COMMANDS = sorted(
    [f"{name} {sub}".strip() for name, cmd in _subcommands(CLI).items() for sub in (_subcommands(cmd) or [""])],
    key=len,
)
# `ctxext CMD …` up to the end of the command as a message writes it (closing backtick, clause, line).
COMMAND_SPAN = re.compile(r"ctxext\s+(" + "|".join(re.escape(c) for c in reversed(COMMANDS)) + r")\b([^`\n;)]*)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@functools.cache
def options(command: str) -> frozenset[str]:
    """Every long option of ``ctxext COMMAND`` (``eval ppl`` for a subcommand), as ``--help`` lists them.

    Read from the command's ``get_params``, which ``--help`` lists: the settings and RoPE-method options
    (``--budget``, ``--allow-beyond-context``, ``--beta-fast``) are generated there, so ``params`` alone misses them.
    """
    cmd = CLI
    for part in command.split():
        cmd = _subcommands(cmd)[part]
    params = cmd.get_params(cmd.make_context(command, ["--help"], resilient_parsing=True))
    return frozenset({o for p in params for o in [*p.opts, *p.secondary_opts] if o.startswith("--")} | {"--help"})


def spans(text: str) -> list[tuple[str, list[str]]]:
    """``(command, flags)`` for every ``ctxext COMMAND …`` a text spells, sentence by sentence."""
    found = []
    for m in COMMAND_SPAN.finditer(text):
        tail = re.split(r"\. |\.$", m.group(2), maxsplit=1)[0]
        found.append((m.group(1), FLAG.findall(tail)))
    return found


def _literals() -> list[tuple[str, int, str]]:
    """Every string in the package (f-strings with their fields as ``X``), with file and line."""
    out = []
    for path in sorted((ROOT / "ctxext").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)  # type: ignore[misc]
            else:
                continue
            out.append((str(path.relative_to(ROOT)), getattr(node, "lineno", 0), text))
    return out


def test_every_command_a_message_spells_has_the_flags_it_suggests():
    bad, seen = [], 0
    for where, line, text in _literals():
        for command, flags in spans(text):
            seen += 1
            bad += [f"{where}:{line}: `ctxext {command}` has no {f}" for f in flags if f not in options(command)]
    assert seen > 20  # the scan finds the package's advice (a regex that matched nothing would pass)
    assert not bad, "\n".join(bad)


def check_output(command: str, output: str) -> None:
    """The flags in a command's output: each on the command it is suggested for."""
    text = " ".join(output.split())
    for named, flags in spans(text):
        missing = [f for f in flags if f not in options(named)]
        assert not missing, f"`ctxext {named}` has no {missing}: {text}"
    loose = FLAG.findall(COMMAND_SPAN.sub("", text))
    missing = [f for f in loose if f not in options(command)]
    assert not missing, f"`ctxext {command}` suggests {missing}, which it does not have: {text}"


def test_the_checker_catches_a_wrong_flag():
    with pytest.raises(AssertionError, match="--relative-to"):
        check_output("search", "say how to compose: --relative-to original")
    with pytest.raises(AssertionError, match="has no"):
        check_output("train", "see `ctxext plan r.yaml --gpus 2`")
    check_output("train", "see `ctxext plan r.yaml --cpu`; or pass --resume")


@pytest.fixture()
def folders(tmp_path, tiny_model_dir):
    """An extended model, a finished-looking run, a user's folder, a recipe on the extended model."""
    ext = tmp_path / "ext"
    assert (
        runner.invoke(app, ["extend", str(tiny_model_dir), "-m", "linear", "-t", "512", "-o", str(ext)]).exit_code == 0
    )
    run_dir = write_fake_run(tmp_path / "run", tiny_model_dir)
    (run_dir / "merged").mkdir()
    (run_dir / "merged" / "notes.txt").write_text("mine")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model:\n  path: {ext}\nrope:\n  method: yarn\n  target_length: 1024\ndata:\n  path: builtin:stdlib\n"
        f"train:\n  seq_len: 512\n  max_steps: 2\noutput:\n  dir: {mine}\n"
    )
    return {
        "model": str(tiny_model_dir),
        "ext": str(ext),
        "run": str(run_dir),
        "mine": str(mine),
        "recipe": str(recipe),
    }


CASES = {
    "search an extended model": ["search", "{ext}", "-t", "1024", "--out", "{mine}-s"],
    "search into a folder in the way": ["search", "{model}", "-t", "1024", "--out", "{mine}"],
    "extend an extended model": ["extend", "{ext}", "-m", "yarn", "-t", "1024", "-o", "{mine}-e"],
    "extend onto an existing output": ["extend", "{model}", "-m", "yarn", "-t", "1024", "-o", "{ext}"],
    "extend onto its source": ["extend", "{model}", "-m", "yarn", "-t", "1024", "-o", "{model}", "--overwrite"],
    "validate a recipe on an extended model": ["validate", "{recipe}"],
    "train a recipe on an extended model": ["train", "{recipe}"],
    "train into a folder in the way": ["train", "{recipe}", "model.path={model}"],
    "merge into its run": ["merge", "{run}", "--out", "{run}"],
    "merge into a user's folder": ["merge", "{run}", "--out", "{mine}"],
    "push --merged over a user's folder": ["push", "{run}", "--repo-id", "me/x", "--merged", "--dry-run"],
    "eval into its run": ["eval", "ppl", "--model", "{run}", "--out", "{run}"],
    "eval into a user's folder": ["eval", "passkey", "--model", "{model}", "--out", "{mine}"],
    "plan without a device": ["plan", "{recipe}"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_what_a_refused_command_suggests_exists_on_it(case, folders):
    args = [a.format(**folders) for a in CASES[case]]
    command = " ".join(args[:2]) if args[0] == "eval" else args[0]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    check_output(command, result.output)
    if command in ("merge", "extend"):  # the report example of the output check is for eval only
        assert "for a report" not in result.output
