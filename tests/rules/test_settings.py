"""Settings are declared once: every option of every ``ctxext`` command comes from its declaration.

A setting with two defaults (a hand-written flag next to a model field) is what these tests catch. The CLI tree
is walked (``eval`` subcommands of registered sections and the RoPE method flags of ``extend`` included), so a new
command cannot escape: each option is generated from a settings model (same name, help from the description, no
default of its own), or is a generated method option, or has a literal default equal to the declared one (the
model field or workflow keyword it feeds), or is the command's own (where the input comes from, where the output
goes, …).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import click
import pytest
import typer.main
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.evaluation.sections.grids.settings import NeedleSettings, PasskeySettings
from ctxext.evaluation.sections.perplexity.settings import PerplexitySettings
from ctxext.evaluation.sections.qa.settings import QASettings
from ctxext.recipe.budget import parse_budget
from ctxext.recipe.calibration import CalibrationSettings
from ctxext.recipe.flags import build_settings, field_help, flag_name
from ctxext.recipe.search import SearchOptions
from ctxext.recipe.sections import SearchSection
from ctxext.search.run import SearchSettings
from tests.helpers import ROOT

runner = CliRunner()

# Options that are not settings of a workflow, each the command's own: where the input comes from (a model,
# a recipe, a suite, key=value overrides), where the output goes (--out, --overwrite), where it runs
# (--device, --gpu …), and how the command talks (--json, --quiet, labels of the compared models).
EVAL_OWN = frozenset({"model", "out", "adapter", "name", "reference", "device", "quiet", "overwrite"})
# search: the run's own fields (SearchSettings beyond the declared SearchOptions) are checked as literal defaults.
SEARCH_RUN = ("model", "target_length", "out", "original_length", "device", "resume", "overwrite")
# Not walked, and why (none today; an entry that no longer matches a command fails).
SKIPPED: dict[tuple[str, ...], str] = {}

DefaultOf = Callable[[], Any]


@dataclass(frozen=True)
class Declared:
    """Where a command's options come from; every option is in exactly one of these.

    Attributes:
        models: settings models each of whose fields is a generated flag (name, help, no default of its own).
        own: the command's own options (not a workflow setting, see above).
        literal: options with a literal default of their own, each with the declared default it must equal and
            how the command reads its flag value (a comma-separated string → the declared list).
        rope: the RoPE method options are generated flags (``ctxext extend``).
    """

    models: tuple[Any, ...] = ()
    own: frozenset[str] = frozenset()
    literal: Mapping[str, tuple[DefaultOf, Callable[[Any], Any]]] = field(default_factory=dict)
    rope: bool = False


def _same(value: Any) -> Any:
    return value


def _numbers(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _arg(fn: Callable[..., Any], name: str, read: Callable[[Any], Any] = _same) -> tuple[DefaultOf, Any]:
    """The default of a workflow function's keyword (the flag's value is passed to it)."""
    return (lambda: inspect.signature(fn).parameters[name].default), read


def _field(model: Any, name: str, read: Callable[[Any], Any] = _same) -> tuple[DefaultOf, Any]:
    """A model field's default (a required field: the flag is optional, another input gives it)."""

    def default() -> Any:
        info = model.model_fields[name]
        return None if info.is_required() else info.get_default(call_default_factory=True)

    return default, read


def _declared() -> dict[tuple[str, ...], Declared]:
    """Every command of the CLI tree and where its options come from (built when asked: sections register late)."""
    from ctxext.cli.evaluate import command_name
    from ctxext.evaluation.sections import SECTIONS
    from ctxext.evaluation.sections.ruler.engine import RulerSettings
    from ctxext.extend.inspection import inspect_model
    from ctxext.models.folder import extend_folder
    from ctxext.planner.plan import plan_recipe
    from ctxext.publish.hub import push
    from ctxext.publish.merge import merge_run
    from ctxext.training.run import train

    shared = ("trials", "seed", "templates", "allow_beyond_context", "chat_template", "answer_margin")
    ruler = {name: _field(RulerSettings, name) for name in shared}
    ruler["depths"] = _field(RulerSettings, "depths", _numbers)
    declared = {("eval", command_name(s)): Declared(models=(s.settings,), own=EVAL_OWN) for s in SECTIONS.values()}
    declared |= {
        (): Declared(own=frozenset({"verbose"})),  # third-party warnings and progress bars, no workflow's
        ("inspect",): Declared(
            own=frozenset({"model", "as_json"}),
            literal={k: _arg(inspect_model, k) for k in ("config_only", "revision", "original_length")},
        ),
        ("extend",): Declared(
            own=frozenset({"model", "method", "target_length", "out", "overwrite"}),
            literal={
                "original_length": _arg(extend_folder, "original_length"),
                "legacy_fields": _arg(extend_folder, "write_legacy"),
                "relative_to": _arg(extend_folder, "relative_to"),
            },
            rope=True,
        ),
        ("validate",): Declared(own=frozenset({"args", "overrides", "schema"})),
        ("methods",): Declared(),
        # --strict: whether to start at all (the plan's verdict), not a setting of the run.
        # The demo's settings are its recipe file and the demo suite, changed by key=value overrides; its flags say
        # where the files come from, where the output goes and which rows to show.
        ("demo",): Declared(
            own=frozenset(
                {"overrides", "out", "recipe", "reference", "quick", "fresh", "plain", "print_recipe_file"}
                | {"removed_model"}  # hidden: the removed --model answers with its replacement, model.path=
            )
        ),
        ("train",): Declared(
            own=frozenset({"recipe", "overrides", "strict"}), literal={"resume": _arg(train, "resume")}
        ),
        # --sp is a recipe override (train.sequence_parallel_size); --gpu/--gpu-memory/--tflops/--cpu: the device.
        ("plan",): Declared(
            own=frozenset({"recipe", "overrides", "gpu", "gpu_memory", "tflops", "cpu", "sp", "as_json", "list_gpus"}),
            literal={
                k: _arg(plan_recipe, k)
                for k in ("num_gpus", "nodes", "sharding", "loss", "utilization", "mode", "offload_optimizer")
            },
        ),
        ("search",): Declared(
            models=(SearchOptions,),
            own=frozenset({"recipe"}),  # where the settings come from
            literal={k: _field(SearchSettings, k) for k in SEARCH_RUN},
        ),
        ("eval",): Declared(),
        # calibrate: the run, held-out text, device and --overwrite are the command's own.
        ("calibrate",): Declared(models=(CalibrationSettings,), own=frozenset({"run", "data", "device", "overwrite"})),
        ("eval", "run"): Declared(own=EVAL_OWN | {"suite", "overrides"}),
        ("tasks",): Declared(),
        ("tasks", "list"): Declared(),
        ("tasks", "export"): Declared(
            own=frozenset({"out", "model", "tasks", "lengths", "fmt", "overwrite"}),
            literal={**ruler, "haystack": _field(RulerSettings, "haystack")},
        ),
        ("export",): Declared(own=frozenset({"src", "targets", "out", "overwrite"})),
        ("merge",): Declared(
            own=frozenset({"run", "out", "device", "overwrite"}),
            literal={
                **{k: _arg(merge_run, k) for k in ("tolerance", "smoke_length", "check_length", "sequences", "dtype")},
                "force": _arg(merge_run, "allow_incomplete"),
            },
        ),
        ("push",): Declared(
            own=frozenset({"run_or_dir", "repo_id", "report", "message"}),
            literal={k: _arg(push, k) for k in ("private", "revision", "merged", "dry_run", "force")},
        ),
    }
    return declared


def _walk(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of the tree, groups included (``eval`` lists the registered sections' commands too)."""
    yield path, command
    if hasattr(command, "list_commands"):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            yield from _walk(command.get_command(ctx, name), (*path, name))


def _tree() -> dict[tuple[str, ...], Any]:
    return {path: cmd for path, cmd in _walk(typer.main.get_command(app)) if path not in SKIPPED}


def test_the_walk_covers_every_command():
    # A new command (or a registered section's) without its declaration fails here, not silently.
    walked = {path for path, _ in _walk(typer.main.get_command(app))}
    assert set(SKIPPED) <= walked, set(SKIPPED) - walked  # a stale skip is noticed
    assert walked - set(SKIPPED) == set(_declared()), (walked - set(SKIPPED)) ^ set(_declared())


@pytest.mark.parametrize("path", sorted(_tree()), ids=lambda p: " ".join(p) or "ctxext")
def test_every_option_is_generated_from_the_declared_settings(path):
    from ctxext.rope.methods import declared_options

    command, declared = _tree()[path], _declared()[path]
    # get_params: the generated flags are added when the command is parsed or its help shown.
    params = {p.name: p for p in command.get_params(click.Context(command)) if p.name != "help"}
    fields = {name: info for model in declared.models for name, info in model.model_fields.items()}
    rope = declared_options() if declared.rope else {}
    groups = [set(fields), set(rope), set(declared.own), set(declared.literal)]
    assert sum(map(len, groups)) == len(set().union(*groups)), groups  # each option comes from one place
    assert set(params) == set().union(*groups), set(params) ^ set().union(*groups)
    for name, param in params.items():
        if name in fields:
            _check_generated(param, name, fields[name])
        elif name in rope:
            # A method option: generated from the method declarations (its help shows each method's default).
            assert param.opts == [flag_name(name)] and param.default is None, (name, param.opts, param.default)
            assert param.help == rope[name].help
        elif name in declared.literal:
            default, read = declared.literal[name]
            assert read(param.default) == default(), (name, param.default, default())
    for model in declared.models:
        # With no flag given, the command's settings are exactly the declared defaults.
        if not any(info.is_required() for info in model.model_fields.values()):
            assert build_settings(model, {}) == model()


def _check_generated(param: Any, name: str, info: Any) -> None:
    assert param.opts == [flag_name(name)], (name, param.opts)
    # No default of its own: an option not given is left out and the model's default applies.
    assert param.default is None, (name, param.default)
    assert param.help == field_help(info) and info.description and info.description in param.help, name
    # The model's default, shown from the declaration (or that the model requires the field).
    assert ("(required)" if info.is_required() else "(default: ") in param.help
    if info.annotation is bool:
        assert param.secondary_opts == [f"--no-{flag_name(name)[2:]}"]


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
    from ctxext.evaluation.sections import SECTIONS
    from ctxext.evaluation.sections.grids.engine import GridSettings, NeedleTask
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
    from ctxext.evaluation.sections.attention.engine import AttentionSettings

    run, declared_attention = AttentionSettings(), SECTIONS["attention"].settings()
    assert (run.docs, run.bands, run.sink_tokens) == (
        declared_attention.docs,
        declared_attention.bands,
        declared_attention.sink_tokens,
    )


def test_the_ruler_engine_runs_the_section_declaration():
    import dataclasses

    from ctxext.evaluation.sections import SECTIONS
    from ctxext.evaluation.sections.grids.engine import GridSettings
    from ctxext.evaluation.sections.ruler.engine import RulerSettings

    declared = SECTIONS["ruler"].settings
    # The engine's settings are the section's model at resolved lengths: no key listed twice, no second default.
    assert issubclass(RulerSettings, declared)
    assert set(RulerSettings.model_fields) - set(declared.model_fields) == {"allow_beyond_context"}
    given = {"depths": [0, 100], "trials": 3, "seed": 7, "scoring": "both", "max_new_tokens": 5, "answer_margin": 2}
    section = declared.model_validate(
        {"tasks": [{"task": "needle"}], "chat_template": "none", "control": True, **given}
    )
    run = RulerSettings.of_section(section, [64, 128], True)
    assert run.model_dump(exclude={"lengths", "allow_beyond_context"}) == section.model_dump(exclude={"lengths"})
    assert (run.lengths, run.allow_beyond_context) == ([64, 128], True)
    # The grid every task runs takes each key it shares with the section from the section.
    grid = run.grid([64], False)
    shared = [
        f.name for f in dataclasses.fields(GridSettings) if f.name in declared.model_fields and f.name != "lengths"
    ]
    assert set(given) | {"chat_template"} <= set(shared)
    assert all(getattr(grid, name) == getattr(section, name) for name in shared), shared
    assert grid.lengths == [64] and grid.allow_beyond_context


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
