"""Messages keep their text: ``[...]`` in a path, a list or another message is not read as rich markup."""

from __future__ import annotations

import io

from rich.console import Console
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.cli.console import plain

runner = CliRunner()
TRICKY = "[bold]x[/] and [/b] in [a, b]"


def solid(text: str) -> str:
    """Without any whitespace: a long path may wrap (pytest-xdist's temporary paths are long)."""
    return "".join(text.split())


def test_plain_text_survives_markup():
    out = io.StringIO()
    Console(file=out, width=200).print(f"[green]ok[/] {plain(TRICKY)} runs/{plain('[exp]')}/r")
    assert out.getvalue().strip() == f"ok {TRICKY} runs/[exp]/r"


def test_paths_and_messages_with_brackets_are_printed_whole(tmp_path, tiny_model_dir):
    folder = tmp_path / "[exp]"
    folder.mkdir()
    recipe = folder / "r.yaml"
    base = "rope: {method: yarn, target_length: 512}\ndata: {path: builtin:stdlib}\ntrain: {max_steps: 1}\n"
    recipe.write_text(f"model: {{path: '{tiny_model_dir}'}}\n" + base)
    ok = runner.invoke(app, ["validate", str(recipe)])
    assert ok.exit_code == 0 and solid(f"✓ {recipe}:") in solid(ok.output), ok.output
    # A problem whose message quotes a value with markup-like text: validate, train and a plain error.
    missing = f"nope/{TRICKY}/m"
    recipe.write_text(f"model: {{path: '{missing}'}}\n" + base)
    for command in ("validate", "train"):
        bad = runner.invoke(app, [command, str(recipe)])
        assert bad.exit_code == 2 and (bad.exception is None or isinstance(bad.exception, SystemExit)), bad.output
        assert "Traceback" not in bad.output
        assert solid(f"{recipe}") in solid(bad.output)
        assert solid(f"model.path: {missing} does not exist") in solid(bad.output)
    err = runner.invoke(app, ["inspect", str(tmp_path / "[exp]" / "[/b]"), "--config-only"])
    assert err.exit_code == 2 and "Traceback" not in err.output
    assert solid(f"{tmp_path}/[exp]/[/b]") in solid(err.output), err.output


def test_a_workflow_line_is_not_wrapped_in_a_log_file(monkeypatch):
    # Written to a file, rich would wrap at 80 columns: a long progress line (numbers, a command) must stay one line.
    import ctxext.cli.console as cli_console

    out = io.StringIO()
    monkeypatch.setattr(cli_console, "console", Console(file=out, width=80))
    line = "checking which needle forms the base retrieves inside its 8,192-token window: " + "x " * 40
    cli_console.print_line(line)
    assert out.getvalue() == line + "\n"
    # Every message of the shared consoles, not only workflow lines, when they do not write to a terminal.
    assert cli_console.err_console.soft_wrap == (not cli_console.err_console.is_terminal)
