"""Advice a user can follow: one table of bad invocations, each run through the real command line.

Every case must end with exit code 2, one message and no traceback; the message must name what is wrong (the
key, flag or file: ``mentions``), every flag it suggests must exist on the command that printed it (parsed from
``--help``, :func:`test_hints.check_output`), and what it must not say (``absent``) is checked too. Each case is
refused before a model is loaded or trained, so the table runs in seconds.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import pytest
from typer.testing import CliRunner

from ctxext.atomic import OUTPUT_MARKER
from ctxext.cli.commands import app
from tests.helpers.train import write_fake_run
from tests.unit.cli.test_hints import check_output

runner = CliRunner()


@dataclass(frozen=True)
class Case:
    """A bad invocation (``{name}`` fields filled from the ``world`` fixture) and what its message must say."""

    args: list[str]
    mentions: list[str]
    absent: list[str] = field(default_factory=list)
    keeps: str | None = None  # the one file a refusal leaves in --out: what a resumed command continues from


RECIPE = (
    "model:\n  path: {model}\nrope:\n  method: yarn\n  target_length: 512\ntrain:\n  seq_len: 512\n"
    "  max_steps: 1\noutput:\n  dir: {fresh}\n"
)
CASES = {
    # Advice naming a flag the command does not have.
    "search an extended model (no --relative-to on search)": Case(
        ["search", "{ext}", "-t", "1024", "--out", "{fresh}"], ["{ext}"]
    ),
    "push --merged over a user's RUN/merged (no --overwrite on push)": Case(
        ["push", "{run}", "--repo-id", "me/x", "--merged", "--dry-run"], ["merged", "`ctxext merge '{run}' --out DIR`"]
    ),
    "merge into a user's folder (no eval example)": Case(
        ["merge", "{run}", "--out", "{mine}", "--overwrite"], ["{mine}"], ["for a report"]
    ),
    "extend onto its source (no eval example)": Case(
        ["extend", "{model}", "-m", "yarn", "-t", "1024", "-o", "{model}", "--overwrite"], ["{model}"], ["for a report"]
    ),
    # A command printed for a path with spaces: quoted, so that pasting it works (checked below).
    "resume a run in a folder with spaces, with another recipe": Case(
        ["train", "{recipe}", "output.dir={spaced}", "--resume"], ["recipe differs", "'output.dir={spaced}'"]
    ),
    # Keys that would be silently ignored.
    "data.path beside a mixture with a corpus": Case(
        ["validate", "{recipe}", "--set", "data.path=builtin:stdlib",
         "--set", "data.mixture=[{{path: 'builtin:stdlib', weight: 1}}]"],
        ["data.path", "would be ignored"],
    ),
    "a recipe key given twice": Case(["validate", "{dup}"], ["train: given twice (lines"]),
    # A value the message must tie to its flag (it named only "evaluation lengths").
    "eval ppl --lengths=-5": Case(
        ["eval", "ppl", "--model", "{model}", "--lengths=-5", "--out", "{fresh}"], ["--lengths", "at least 2 tokens"]
    ),
    # A binary file given as a recipe or suite (it was a UnicodeDecodeError traceback).
    "train a recipe that is not text": Case(["train", "{binary}"], ["{binary} is not UTF-8 text"]),
    "eval run a suite that is not text": Case(
        ["eval", "run", "{binary}", "--model", "{model}", "--out", "{fresh}"], ["{binary} is not UTF-8 text"]
    ),
    "a task sample longer than train.seq_len": Case(
        ["validate", "{recipe}", "data.mixture=[{{task: passkey, weight: 1, min_length: 4096}}]",
         "data.path=builtin:stdlib"],
        ["data.mixture.0.min_length", "train.seq_len"],
    ),
    # A message holding [...] (rich markup) is printed whole.
    "a model path with brackets": Case(["eval", "ppl", "--model", "runs/[exp]/x", "--out", "{fresh}"], ["[exp]"]),
    # validate refuses what train would refuse.
    "validate a recipe whose output.dir is a user's folder": Case(
        ["validate", "{recipe}", "output.dir={mine}"], ["output.dir", "{mine}", "not empty"]
    ),
    "validate a recipe whose output.dir is a file": Case(
        ["validate", "{recipe}", "output.dir={afile}"], ["output.dir", "{afile}", "is a file"]
    ),
    "train into a complete run (--resume would be refused)": Case(
        ["train", "{recipe}", "output.dir={run}"], ["output.dir", "holds a complete run"], ["--resume"]
    ),
    "validate a recipe whose output.dir holds a complete run": Case(
        ["validate", "{recipe}", "output.dir={run}"], ["output.dir", "holds a complete run"], ["--resume"]
    ),
    "validate takes train's key=value overrides": Case(
        ["validate", "{recipe}", "train.micro_batch_size=0"], ["train.micro_batch_size"], ["does not exist"]
    ),
    # Absurd values: bounded, refused with the flag that allows them.
    "eval at 100,000 tokens of a 256-token model": Case(
        ["eval", "ppl", "--model", "{model}", "--lengths", "100000", "--out", "{fresh}"],
        ["100,000", "--allow-beyond-context"],
    ),
    "tasks export at 100,000 tokens": Case(
        ["tasks", "export", "{fresh}", "--model", "{model}", "--tasks", "passkey", "--lengths", "100000"],
        ["--lengths", "--allow-beyond-context"],
    ),
    "a report with a negative perplexity for the card": Case(
        ["push", "{good_run}", "--repo-id", "me/x", "--dry-run", "--report", "{bad_report}"],
        ["{bad_report}", "at least 1"],
    ),
    "plan --tflops -5 for a GPU of the table": Case(
        ["plan", "{recipe}", "--gpu", "h100-80gb", "--tflops", "-5"], ["--tflops", "--gpu-memory"]
    ),
    "plan --tflops -5 for a --gpu-memory GPU": Case(
        ["plan", "{recipe}", "--gpu-memory", "80GB", "--tflops", "-5"], ["--tflops", "positive"]
    ),
    "longrope factors below 1": Case(
        ["extend", "{model}", "-m", "longrope", "-t", "1024", "-o", "{fresh}", "--factors-file", "{factors}"],
        ["short_factor", "long_factor", ">= 1"],
    ),
    "a factors file that is not text": Case(
        ["extend", "{model}", "-m", "longrope", "-t", "1024", "-o", "{fresh}", "--factors-file", "{binary}"],
        ["factors_file", "{binary} is not UTF-8 text"],
    ),
    "a factors file holding a list": Case(
        ["extend", "{model}", "-m", "longrope", "-t", "1024", "-o", "{fresh}", "--factors-file", "{listed}"],
        ["factors_file", "{listed} must hold a JSON object"],
    ),
    "a search budget spent before the first candidate": Case(
        ["search", "{model}", "-t", "512", "--out", "{fresh}", "--budget", "0.01s", "--objective", "far-ppl"],
        ["budget", "--budget 10m", "--resume"],
        keeps="search.jsonl",
    ),
}  # fmt: skip


def _set_first(obj: Any, key: str, value: float) -> bool:
    """Set the first non-null ``key`` found in parsed JSON to ``value``."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        if k == key and isinstance(v, int | float):
            obj[k] = value
            return True
        if _set_first(v, key, value):
            return True
    return False


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir) -> dict[str, str]:
    """Inputs for the table: models, runs, a user's folder, recipes, a damaged report (built once)."""
    from tests.helpers.hub import shared_run

    root = tmp_path_factory.mktemp("weak")
    ext = root / "ext"
    done = runner.invoke(app, ["extend", str(tiny_model_dir), "-m", "linear", "-t", "512", "-o", str(ext)])
    assert done.exit_code == 0, done.output
    mine = root / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    (root / "afile").write_text("x")
    # A space in the path: every command printed for it must survive pasting.
    run = write_fake_run(root / "my runs" / "run", tiny_model_dir)
    (run / "merged").mkdir()
    (run / "merged" / "notes.txt").write_text("mine")
    # An interrupted run whose recipe differs from the one given.
    spaced = write_fake_run(root / "my runs" / "r 1", tiny_model_dir, status="interrupted")
    (spaced / "recipe.yaml").write_text(RECIPE.format(model=tiny_model_dir, fresh=spaced).replace("512", "768", 1))
    recipe = root / "r.yaml"
    recipe.write_text(RECIPE.format(model=tiny_model_dir, fresh=root / "new-run") + "data:\n  path: builtin:stdlib\n")
    dup = root / "dup.yaml"
    dup.write_text(recipe.read_text() + "train:\n  seq_len: 256\n")
    binary = root / "model.yaml"
    binary.write_bytes(bytes(range(250, 256)) * 50)
    factors = root / "factors.json"
    factors.write_text(json.dumps({"short_factor": [0.5] * 8, "long_factor": [0.5] * 8}))
    listed = root / "listed.json"
    listed.write_text(json.dumps([[1.0] * 8, [2.0] * 8]))
    good_run = shared_run(tmp_path_factory, tiny_model_dir)
    report = json.loads((good_run / "eval" / "report.json").read_text())
    assert _set_first(report, "ppl", -5.0)
    bad_report = root / "bad" / "report.json"
    bad_report.parent.mkdir()
    bad_report.write_text(json.dumps(report))
    paths = dict(model=tiny_model_dir, ext=ext, mine=mine, afile=root / "afile", run=run, spaced=spaced)
    paths |= dict(recipe=recipe, dup=dup, binary=binary, factors=factors, listed=listed)
    paths |= dict(good_run=good_run, bad_report=bad_report)
    return {k: str(v) for k, v in paths.items()}


def _command(args: list[str]) -> str:
    """The command as ``--help`` knows it: ``eval ppl`` and ``tasks export`` are subcommands."""
    return " ".join(args[:2]) if args[0] in ("eval", "tasks") else args[0]


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_invocation_gets_advice_that_works(name, world, tmp_path):
    case = CASES[name]
    values = {**world, "fresh": str(tmp_path / "out")}
    args = [a.format(**values) for a in case.args]
    result = runner.invoke(app, args)
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), result.exception
    for needed in case.mentions:
        assert needed.format(**values) in text, f"{name}: the message does not say {needed!r}: {text}"
    for wrong in case.absent:
        assert wrong not in text, f"{name}: the message says {wrong!r}: {text}"
    check_output(_command(args), result.output)
    out = tmp_path / "out"
    if case.keeps is None:
        assert not out.exists()  # a refusal writes nothing
    else:
        assert (out / case.keeps).is_file() and {p.name for p in out.iterdir()} == {case.keeps, OUTPUT_MARKER}
    # A printed command is one a shell reads back as written: a path with a space in it stays one argument.
    spaced = [v for v in values.values() if " " in v]
    for command in re.findall(r"`(ctxext [^`]+)`", text):
        words = shlex.split(command)
        for path in spaced:
            if path in command:  # printed: as one word (a path, key=path, or a file in it)
                whole = [w for w in words if w.split("=", 1)[-1] == path or w.startswith(path + "/")]
                assert whole, f"{name}: {path} does not survive pasting {command}"
