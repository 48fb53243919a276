"""Extension points: a RoPE method and a suite section, each one file (tests/helpers/toy_*.py), reach every part.

The method's one declaration must appear in the recipe schema and the ``ctxext extend`` flags, and the
method must extend a tiny model that passes runtime verification; the section must validate, run in a
suite, render in the report, and get its own ``ctxext eval`` subcommand, a plot, paired statistics in the
report's comparisons and rows in the model card. Nothing else is edited to add them.
"""

from __future__ import annotations

import importlib
import json

import pytest
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.errors import InputError
from ctxext.recipe.schema import RecipeError, parse_recipe, schema_lines

RECIPE = {"model": {"path": "builtin:tiny-llama"}, "data": {"path": "builtin:stdlib"}}


@pytest.fixture
def toy_method():
    from ctxext.rope.methods import METHODS, register_method, unregister_method

    module = importlib.import_module("tests.helpers.toy_rope_method")
    register_method(module.PowerTheta)  # again after an earlier test unregistered it
    yield METHODS["toy_power_theta"]
    unregister_method("toy_power_theta")


@pytest.fixture
def toy_section():
    from ctxext.evaluation.sections import SECTIONS, register_section, unregister_section

    module = importlib.import_module("tests.helpers.toy_eval_section")
    register_section(module.RepeatCopy)
    yield SECTIONS["toy_repeat"]
    unregister_section("toy_repeat")


def test_a_method_file_reaches_schema_and_cli_and_extends_a_model(toy_method, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from ctxext.rope.read import read_rope
    from ctxext.rope.runtime import verify_model_rope

    # The recipe schema: listed, converted, checked, refused for another method.
    assert any(line.strip().startswith("rope.theta_power: float") for line in schema_lines())
    recipe = parse_recipe({**RECIPE, "rope": {"method": "toy_power_theta", "target_length": 1024, "theta_power": 3}})
    assert recipe.rope.options() == {"theta_power": 3.0}
    with pytest.raises(RecipeError) as bad:
        parse_recipe({**RECIPE, "rope": {"method": "toy_power_theta", "target_length": 1024, "theta_power": -1}})
    assert bad.value.problems == [("rope.theta_power", "must be a finite number > 0, got -1")]
    with pytest.raises(RecipeError) as other:
        parse_recipe({**RECIPE, "rope": {"method": "yarn", "target_length": 1024, "theta_power": 3}})
    assert other.value.problems[0][0] == "rope.theta_power"

    # The command line: a flag in `extend --help`, a row in `ctxext methods`, and a real extension.
    runner = CliRunner()
    assert "--theta-power" in runner.invoke(app, ["extend", "--help"], terminal_width=200).output
    assert "toy_power_theta" in runner.invoke(app, ["methods"], terminal_width=200).output
    out = tmp_path / "extended"
    args = ["extend", str(tiny_model_dir), "-m", "toy_power_theta", "-t", "1024", "--theta-power", "3", "-o", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"]["rope_theta"] == pytest.approx(10000.0 * 4**3)
    assert config["ctxext"]["method"] == "toy_power_theta"
    model = AutoModelForCausalLM.from_pretrained(out)
    assert verify_model_rope(model).ok
    assert read_rope(model.config).current_length == 1024

    refused = runner.invoke(app, [*args[:-1], str(tmp_path / "x"), "--theta-power", "0"])
    assert refused.exit_code == 2 and "theta_power" in refused.output


def test_a_section_file_runs_in_a_suite_and_renders(toy_section, tiny_model_dir, tmp_path):
    from ctxext.evaluation.suite import load_suite, run_suite
    from ctxext.models.load import ModelSpec

    path = tmp_path / "suite.yaml"
    path.write_text("name: toy\nallow_beyond_context: true\ntoy_repeat: {lengths: ['1x', 512], trials: 1}\n")
    suite, _ = load_suite(path)
    report = run_suite(suite, [ModelSpec(str(tiny_model_dir), name="tiny")], tmp_path / "rep", show_progress=False)
    result = report["models"][0]["toy_repeat"]
    assert set(result["by_length"]) == {"256", "512"}
    assert all(0.0 <= v <= 1.0 for v in result["by_length"].values())
    markdown = (tmp_path / "rep" / "report.md").read_text()
    assert "## Repeated-sequence copying (toy section)" in markdown and "by_length.512" in markdown
    assert report["suite"]["definition"]["toy_repeat"]["trials"] == 1

    path.write_text("name: toy\ntoy_repeat: {trials: 0}\n")
    with pytest.raises(InputError, match="toy_repeat.trials"):
        load_suite(path)
    path.write_text("name: toy\ntoy_repeet: {}\n")
    with pytest.raises(InputError, match="toy_repeet: Extra inputs are not permitted"):
        load_suite(path)


def test_a_section_file_gets_a_command_a_plot_paired_statistics_and_card_rows(toy_section, tiny_model_dir, tmp_path):
    from ctxext.artifacts.run import RunRecord, load_report
    from ctxext.publish.card import card_inputs, render_card

    runner = CliRunner()
    assert "toy-repeat" in runner.invoke(app, ["eval", "--help"], terminal_width=200).output
    assert "--trials" in runner.invoke(app, ["eval", "toy-repeat", "--help"], terminal_width=200).output
    out = tmp_path / "rep"
    models = ["--model", str(tiny_model_dir), "--name", "a", "--model", str(tiny_model_dir), "--name", "b"]
    args = ["eval", "toy-repeat", *models, "--lengths", "64,128", "--trials", "3", "-q", "--out", str(out)]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "toy_repeat — a: 64: " in result.output  # the section's console summary
    report = json.loads((out / "report.json").read_text())
    assert [len(m["toy_repeat"]["per_trial"]["128"]) for m in report["models"]] == [3, 3]

    # A plot (the default: the section's numbers by length), shown in report.md under the section.
    assert (out / "toy_repeat.png").read_bytes()[:4] == b"\x89PNG"
    markdown = (out / "report.md").read_text()
    assert "![toy repeat](toy_repeat.png)" in markdown

    # Paired statistics (the section's hook): the same seeded trials for both models, so b − a is exactly 0,
    # stored under the section's name and counted in the report's Holm family.
    rows = report["comparisons"]["toy_repeat"]
    assert [(r["model"], r["length"]) for r in rows] == [("b", 64), ("b", 128)]
    assert all(r["difference"] == 0 and r["documents"] == 3 and "p_holm" in r for r in rows)
    assert "### Repeated-sequence copying (toy section), paired against `a`" in markdown

    # Rows in the model card (the default: the section's report table under a line of its own).
    run = RunRecord(status="complete", base_model=str(tiny_model_dir), method="none", target_length=None)
    card = render_card(card_inputs(tiny_model_dir, run, [load_report(out)]))
    assert "Repeated-sequence copying (toy section):" in card and "| by_length.128 |" in card
    assert "(plots/toy_repeat.png)" in card

    # A bad flag: exit 2 naming it, nothing written.
    bad = runner.invoke(app, [*args[:-1], str(tmp_path / "bad"), "--trials", "0"])
    assert bad.exit_code == 2 and "--trials" in bad.output and not (tmp_path / "bad").exists()


def test_generated_flags_take_lists_and_booleans(tiny_model_dir, tmp_path):
    runner = CliRunner()
    base = ["extend", str(tiny_model_dir), "-t", "1024"]
    longrope = [*base, "-m", "longrope", "--short-factor", ",".join(["1"] * 8), "--long-factor", "[1,2,3,4,5,6,7,8]"]
    result = runner.invoke(app, [*longrope, "-o", str(tmp_path / "lr")])
    assert result.exit_code == 0, result.output
    params = json.loads((tmp_path / "lr" / "config.json").read_text())["rope_parameters"]
    assert params["short_factor"] == [1.0] * 8 and params["long_factor"] == [float(i) for i in range(1, 9)]
    result = runner.invoke(app, [*base, "-m", "yarn", "--no-truncate", "-o", str(tmp_path / "yarn")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "yarn" / "config.json").read_text())["rope_parameters"]["truncate"] is False
    bad = runner.invoke(app, [*base, "-m", "longrope", "--short-factor", "1,x", "-o", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "--short-factor" in bad.output and not (tmp_path / "bad").exists()
