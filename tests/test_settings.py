"""Settings are declared once: every flag of ``ctxext search`` / ``ctxext eval ppl`` comes from the declared model.

A setting with two defaults (a hand-written flag next to a model field) is what these tests catch: each option
of the two commands is either generated from its workflow's settings model (same name, help from the
description, no default of its own) or names the run and has the runtime model's default.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
import typer.main
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.evaluation.settings import NeedleSettings, PasskeySettings, PerplexitySettings, QASettings
from ctxext.recipe.budget import parse_budget
from ctxext.recipe.flags import build_settings, field_help, flag_name
from ctxext.recipe.search import SearchOptions
from ctxext.recipe.sections import SearchSection
from ctxext.search.run import SearchSettings

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

# Options that are not settings of the workflow, and why each is the command's own.
SEARCH_RUN = {"model", "target_length", "out", "original_length", "device", "resume", "overwrite"}  # SearchSettings
SEARCH_OWN = {"recipe"}  # where the settings come from
# The options every `ctxext eval` command shares (ctxext/cli/evaluate.py Shared, --model, --out).
EVAL_OWN = {"model", "out", "adapter", "name", "reference", "device", "quiet", "overwrite"}


def _command(*path: str):
    command = typer.main.get_command(app)
    for name in path:  # get_command: `eval qa` is generated from its registered section when asked for
        command = command.get_command(click.Context(command), name)
    return command


COMMANDS = [
    pytest.param(("search",), SearchOptions, SearchSettings, SEARCH_RUN, SEARCH_OWN, id="search"),
    pytest.param(("eval", "ppl"), PerplexitySettings, PerplexitySettings, set(), EVAL_OWN, id="eval ppl"),
    pytest.param(("eval", "passkey"), PasskeySettings, PasskeySettings, set(), EVAL_OWN, id="eval passkey"),
    pytest.param(("eval", "needle"), NeedleSettings, NeedleSettings, set(), EVAL_OWN, id="eval needle"),
    pytest.param(("eval", "qa"), QASettings, QASettings, set(), EVAL_OWN, id="eval qa"),
]


@pytest.mark.parametrize(("path", "declared", "runtime", "run_fields", "own"), COMMANDS)
def test_every_option_is_generated_from_the_declared_settings(path, declared, runtime, run_fields, own):
    command = _command(*path)
    # get_params: the generated flags are added when the command is parsed or its help shown.
    params = {p.name: p for p in command.get_params(click.Context(command)) if p.name != "help"}
    # Every declared field is a flag of the command, and nothing else declares a setting.
    assert set(declared.model_fields) <= set(params)
    assert set(params) == set(declared.model_fields) | run_fields | own, set(params) ^ (
        set(declared.model_fields) | run_fields | own
    )
    for name, param in params.items():
        if name in declared.model_fields:
            info = declared.model_fields[name]
            assert param.opts == [flag_name(name)], (name, param.opts)
            # No default of its own: an option not given is left out and the model's default applies.
            assert param.default is None, (name, param.default)
            assert param.help == field_help(info) and info.description and info.description in param.help
            # The model's default, shown from the declaration (or that the model requires the field).
            assert ("(required)" if info.is_required() else "(default: ") in param.help
            if info.annotation is bool:
                assert param.secondary_opts == [f"--no-{flag_name(name)[2:]}"]
        elif name in run_fields:
            info = runtime.model_fields[name]
            # A run field the model requires may still be optional on the command line (--recipe gives it).
            expected = None if info.is_required() else info.get_default(call_default_factory=True)
            assert param.default == expected, (name, param.default, expected)
    # With no flag given, the command's settings are exactly the declared defaults.
    required = {name: "x" for name, info in declared.model_fields.items() if info.is_required()}
    assert build_settings(declared, {}, required) == declared(**required)


def test_the_recipe_section_is_the_declared_search_options_plus_out():
    assert issubclass(SearchSection, SearchOptions) and issubclass(SearchSettings, SearchOptions)
    assert set(SearchSection.model_fields) - set(SearchOptions.model_fields) == {"out"}
    for name, info in SearchOptions.model_fields.items():
        # Subclasses add fields; none redeclares a default.
        for sub in (SearchSection, SearchSettings):
            assert sub.model_fields[name].get_default(call_default_factory=True) == info.get_default(
                call_default_factory=True
            )


def test_suite_sections_are_the_commands_settings():
    from ctxext.evaluation.grid import GridSettings, NeedleTask
    from ctxext.evaluation.sections import SECTIONS
    from ctxext.evaluation.suite import Suite

    # Registered sections: each one's settings model is its command's, and a suite validates its key with it.
    names = ("perplexity", "passkey", "needle", "qa")
    assert [SECTIONS[k].settings for k in names] == [PerplexitySettings, PasskeySettings, NeedleSettings, QASettings]
    assert isinstance(Suite.model_validate({"name": "s", "perplexity": {}}).perplexity, PerplexitySettings)
    # The grid engine's arguments take their defaults from the declaration (no second default).
    grid, declared = GridSettings(lengths=[64]), PasskeySettings()
    assert (grid.depths, grid.trials, grid.seed, grid.scoring) == (
        declared.depths,
        declared.trials,
        declared.seed,
        declared.scoring,
    )
    needle, declared_needle = NeedleTask(), NeedleSettings()
    assert (needle.haystack, needle.split) == (declared_needle.haystack, declared_needle.split)


def test_search_defaults_are_the_published_recommended_settings():
    # benchmarks/results/search.md: the 4x result that meets its targets (needle >= 80 % at every depth, in-window
    # unchanged) ran with these settings; they are the defaults (docs/search.md).
    page = (ROOT / "benchmarks" / "results" / "search.md").read_text()
    section = page.split("## 4× (64 → 256 tokens), attention factor searched, in-window tolerance 0 %", 1)[1]
    flags = re.search(r"`(--objective [^`]+)`", section)
    assert flags is not None
    pairs = dict(re.findall(r"--([\w-]+) (\S+)", flags.group(1)))
    defaults = SearchOptions()
    assert pairs["objective"] == defaults.objective
    assert int(pairs["samples"]) == defaults.samples
    assert int(pairs["population"]) == defaults.population
    assert int(pairs["generations"]) == defaults.generations
    assert parse_budget(pairs["budget"]) == defaults.budget_seconds
    assert defaults.attention_factor == "search" and defaults.window_tolerance == 0.0


def test_search_flags_are_checked_by_the_declaration_and_name_the_flag(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    base = ["search", str(tiny_model_dir), "--target-length", "512", "--out", str(out)]
    for flag, value in (("--samples", "0"), ("--window-tolerance", "150"), ("--attention-factor", "big")):
        result = runner.invoke(app, [*base, flag, value])
        assert result.exit_code == 2, result.output
        assert flag in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_percent_is_converted_once():
    settings = build_settings(SearchSettings, {"window_tolerance": 0.5, "min_form_accuracy": 50}, _run())
    assert settings.window_tolerance_fraction == 0.005 and settings.min_form_accuracy_fraction == 0.5
    # The log records what the algorithm uses (fractions), as it always has: older logs still resume.
    logged = settings.logged(64, 16)
    assert logged["window_tolerance"] == 0.005 and logged["min_form_accuracy"] == 0.5


def _run() -> dict[str, object]:
    return {"model": "m", "target_length": 256, "out": "o"}


def test_validate_schema_lists_the_search_section():
    result = runner.invoke(app, ["validate", "--schema"])
    assert result.exit_code == 0, result.output
    for name in SearchSection.model_fields:
        assert f"search.{name}:" in result.output, name
    assert "search.samples: int = 128" in result.output


def test_eval_ppl_and_eval_run_read_the_same_documents_by_default(tiny_model_dir, tmp_path):
    suite = tmp_path / "ppl.yaml"
    suite.write_text("name: ppl-defaults\nperplexity: {}\n")  # every perplexity key at its default
    model = ["--model", str(tiny_model_dir), "-q"]
    ppl = runner.invoke(app, ["eval", "ppl", *model, "--out", str(tmp_path / "ppl")])
    run = runner.invoke(app, ["eval", "run", str(suite), *model, "--out", str(tmp_path / "run")])
    assert ppl.exit_code == 0 and run.exit_code == 0, ppl.output + run.output
    a, b = (json.loads((tmp_path / d / "report.json").read_text())["models"][0]["perplexity"] for d in ("ppl", "run"))
    # The same documents (content keys), as many as the declared max_docs, and so the same numbers.
    assert a["per_document"]["keys"] == b["per_document"]["keys"]
    assert a["documents"]["common"] == b["documents"]["common"] == PerplexitySettings().max_docs
    assert a["by_length"] == b["by_length"] and a["settings"] == b["settings"]
