"""Every command, every path it reads, every way that path can be wrong: exit 2, one message naming the path.

The sweep behind issue 39's "messages that name neither the key nor the file": for each input a command reads
(a model, a run, a recipe, a suite, a data file, an adapter, a report), a path that does not exist, an empty file,
and a folder where a file belongs (or a file where a folder belongs). Each must be refused before any work with
exit code 2, no traceback, and the path the user typed in the message, and must leave the working folder as it was.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ctxext.cli.commands import app
from tests.helpers.hub import file_hashes

runner = CliRunner()

# What a command reads, with the rest of a command line that would otherwise run; BAD is the wrong path.
READS: dict[str, list[str]] = {
    "inspect model": ["inspect", "BAD"],
    "extend model": ["extend", "BAD", "-m", "yarn", "-t", "1024", "-o", "out"],
    "validate recipe": ["validate", "BAD"],
    "train recipe": ["train", "BAD"],
    "plan recipe": ["plan", "BAD", "--cpu"],
    "search model": ["search", "BAD", "-t", "1024", "--out", "out"],
    "search recipe": ["search", "--recipe", "BAD"],
    "calibrate run": ["calibrate", "BAD"],
    "export run": ["export", "BAD", "--for", "vllm"],
    "merge run": ["merge", "BAD", "--out", "out"],
    "push run": ["push", "BAD", "--repo-id", "me/x", "--dry-run"],
    "eval run suite": ["eval", "run", "BAD", "--model", "{model}", "--out", "out"],
    "eval ppl model": ["eval", "ppl", "--model", "BAD", "--out", "out"],
    "eval ppl adapter": ["eval", "ppl", "--model", "{model}", "--adapter", "BAD", "--out", "out"],
    "eval ppl data": ["eval", "ppl", "--model", "{model}", "--data", "BAD", "--out", "out"],
    "eval needle haystack": ["eval", "needle", "--model", "{model}", "--haystack", "BAD", "--out", "out"],
    "eval passkey model": ["eval", "passkey", "--model", "BAD", "--out", "out"],
    "eval harness model": ["eval", "harness", "--model", "BAD", "--tasks", "arc_easy", "--out", "out"],
    "tasks export model": ["tasks", "export", "out", "--model", "BAD", "--tasks", "passkey", "--lengths", "256"],
    "tasks export haystack": ["tasks", "export", "out", "--model", "{model}", "--tasks", "passkey", "--lengths", "256",
                              "--haystack", "BAD"],
    "demo recipe": ["demo", "--recipe", "BAD", "--out", "out"],
}  # fmt: skip
# The ways a path can be wrong, and what to create there.
KINDS = {"missing": None, "empty file": "", "folder": "folder"}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("what", list(READS))
def test_a_wrong_path_is_named(what, kind, tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / f"wrong-{kind.replace(' ', '-')}"
    if KINDS[kind] == "folder":
        bad.mkdir()
    elif KINDS[kind] is not None:
        bad.write_text(KINDS[kind])
    args = [a.replace("BAD", bad.name).replace("{model}", str(tiny_model_dir)) for a in READS[what]]
    before = file_hashes(tmp_path)
    result = runner.invoke(app, args)
    output = " ".join(result.output.split())
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert bad.name in output, result.output
    assert "Traceback" not in result.output
    assert file_hashes(tmp_path) == before
