"""The attention temperature: run time and folded weights agree, ``ctxext calibrate`` records a choice, and
loading, merging and pushing a calibrated run carry it (or refuse to drop it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.errors import InputError
from ctxext.models.temperature import (
    CALIBRATION_FILE,
    adapter_digest,
    attention_modules,
    fold_attention_temperature,
    read_calibration,
    set_attention_temperature,
)
from tests.helpers.hub import copy_run, shared_run, write_calibration
from tests.helpers.tiny import tiny_model

runner = CliRunner()


def flat(result) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def tiny_neox(seed: int = 0):
    """A tiny GPT-NeoX (partial rotary: a quarter of each head), as the grown NeoX base is shaped."""
    from transformers import AutoModelForCausalLM, GPTNeoXConfig

    torch.manual_seed(seed)
    config = GPTNeoXConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        rotary_pct=0.25,
        max_position_embeddings=256,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "neox"])
def test_folded_weights_give_the_run_time_temperature(kind):
    """q scaled in the weights = every logit scaled at run time (NeoX: its fused qkv, the whole head)."""
    make = tiny_neox if kind == "neox" else lambda: tiny_model(kind)
    ids = torch.randint(0, 512, (2, 96), generator=torch.Generator().manual_seed(0))
    runtime, folded = make(), make()
    plain = logits(runtime, ids)
    # A random model's logits are near 0, so a large factor is needed for the change to show.
    assert set_attention_temperature(runtime, 3.0) == 2
    hot = logits(runtime, ids)
    fold_attention_temperature(folded, 3.0)
    assert (hot - plain).abs().max() > 1e-3
    torch.testing.assert_close(logits(folded, ids), hot, rtol=1e-5, atol=1e-5)


def test_the_temperature_is_absolute_not_compounded():
    model = tiny_model("llama")
    ids = torch.randint(0, 512, (1, 64), generator=torch.Generator().manual_seed(1))
    plain = logits(model, ids)
    set_attention_temperature(model, 1.3)
    set_attention_temperature(model, 1.3)
    assert [m.scaling for m in attention_modules(model)] == pytest.approx([1.3 * 16**-0.5] * 2)
    set_attention_temperature(model, 1.0)
    assert torch.equal(logits(model, ids), plain)


def test_bad_temperatures_and_unknown_architectures_are_named():
    model = tiny_model("llama")
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(InputError, match="not a positive number"):
            set_attention_temperature(model, bad)
    model.config.model_type = "mystery"
    with pytest.raises(InputError, match="'mystery'.*query projection"):
        fold_attention_temperature(model, 1.2)


def test_a_damaged_calibration_record_is_named(tmp_path):
    assert read_calibration(tmp_path) is None
    (tmp_path / CALIBRATION_FILE).write_text("{not json")
    with pytest.raises(InputError, match=r"calibration\.json: cannot be read.*--overwrite"):
        read_calibration(tmp_path)
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps({"attention_temperature": -2}))
    with pytest.raises(InputError, match="attention_temperature: -2 is not a positive number"):
        read_calibration(tmp_path)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_model_dir) -> Path:
    return shared_run(tmp_path_factory, tiny_model_dir)


def calibrated(run: Path, dest: Path, t: float) -> Path:
    return write_calibration(copy_run(run, dest), t)


SMALL = ["--trials", "2", "--window-trials", "1", "--depths", "0,100", "--windows", "8"]


def test_calibrate_measures_each_candidate_and_records_the_choice(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run")
    args = ["calibrate", str(run), "--data", "builtin:stdlib-train", "--temperatures", "1.5", *SMALL]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads((run / CALIBRATION_FILE).read_text())
    assert [c["attention_temperature"] for c in record["candidates"]] == [1.0, 1.5]
    assert record["adapter"] == adapter_digest(run)
    assert all(c["target_trials"] == 4 and c["window_trials"] == 2 for c in record["candidates"])
    # Four trials cannot make a significant gain: the run keeps its own sharpness, and says why.
    assert record["attention_temperature"] == 1.0 and record["reason"]
    cost = [c["window_ppl_vs_1"] for c in record["candidates"]]
    assert cost[0]["documents"] == 8 and cost[0]["ratio"] == 1.0 != cost[1]["ratio"]
    assert "attention temperature 1" in flat(result)
    # Once calibrated, a second calibration must be asked for; the record is left as it was.
    before = (run / CALIBRATION_FILE).read_bytes()
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "--overwrite" in flat(again)
    assert (run / CALIBRATION_FILE).read_bytes() == before


def test_calibrate_refuses_bad_settings_before_loading_anything(tiny_run, tmp_path):
    result = runner.invoke(app, ["calibrate", str(tmp_path / "nope"), "--temperatures", "1.2,-1"])
    assert result.exit_code == 2 and "--temperatures" in flat(result) and "Traceback" not in result.output
    result = runner.invoke(app, ["calibrate", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "nope" in flat(result)


@pytest.mark.parametrize("data", ["builtin:stdlib", "builtin:stdlib-heldout", "builtin:stdlib-long"])
def test_calibrate_refuses_the_evaluations_held_out_data(tiny_run, tmp_path, data):
    """The guard search uses: a temperature chosen on the files the evaluation then scores would flatter it."""
    run = copy_run(tiny_run, tmp_path / "run")
    result = runner.invoke(app, ["calibrate", str(run), "--data", data, *SMALL])
    text = flat(result)
    assert result.exit_code == 2 and f"--data: {data} reads" in text and "leave --data out" in text, text
    assert "Traceback" not in result.output and not (run / CALIBRATION_FILE).exists()


def test_a_calibrated_run_loads_with_its_temperature(tiny_run, tmp_path):
    from ctxext.models.load import ModelSpec, load_model

    run = calibrated(tiny_run, tmp_path / "run", 1.25)
    loaded = load_model(ModelSpec(str(run)), device="cpu")
    assert loaded.info["attention_temperature"] == 1.25
    assert [m.scaling for m in attention_modules(loaded.model)] == pytest.approx([1.25 * 16**-0.5] * 2)
    # A record measured on other adapter weights (the run trained further since) is refused, not applied.
    write_calibration(run, 1.25, adapter="sha256:00")
    with pytest.raises(InputError, match="other weights.*--overwrite"):
        load_model(ModelSpec(str(run)), device="cpu")
    # What the message asks for works: calibrating again does not load the stale record.
    result = runner.invoke(app, ["calibrate", str(run), "--overwrite", "--data", "builtin:stdlib-train", *SMALL])
    assert result.exit_code == 0, result.output
    assert json.loads((run / CALIBRATION_FILE).read_text())["adapter"] == adapter_digest(run)


def test_merging_a_calibrated_run_folds_the_temperature_into_the_query(tiny_run, tmp_path):
    """The merge's own check compares base + adapter at t with the reloaded folded model."""
    from safetensors.torch import load_file

    from ctxext.publish.merge import merge_run

    run = calibrated(tiny_run, tmp_path / "run", 1.25)
    result = merge_run(run, tmp_path / "merged", log=lambda line: None, smoke_length=512)
    assert result.ok and result.max_abs_diff <= 1e-4
    meta = json.loads((tmp_path / "merged" / "ctxext_merge.json").read_text())
    assert meta["smoke"]["attention_temperature"] == 1.25
    from ctxext.publish.card import build_model_card

    assert "multiplied by 1.25" in build_model_card(tmp_path / "merged")
    plain = merge_run(copy_run(tiny_run, tmp_path / "plain"), tmp_path / "m1", log=lambda line: None, smoke_length=512)
    assert plain.ok
    hot, cold = load_file(tmp_path / "merged" / "model.safetensors"), load_file(tmp_path / "m1" / "model.safetensors")
    key = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(hot[key], 1.25 * cold[key])
    key = "model.layers.0.self_attn.k_proj.weight"
    torch.testing.assert_close(hot[key], cold[key])


def test_pushing_a_calibrated_adapter_is_refused(tiny_run, tmp_path):
    run = calibrated(tiny_run, tmp_path / "run", 1.25)
    result = runner.invoke(app, ["push", str(run), "--repo-id", "me/x", "--dry-run"])
    assert result.exit_code == 2 and "--merged" in flat(result) and "1.25" in flat(result)
    assert not (run / "hub").exists()


def test_held_out_texts_are_the_runs_validation_documents(tiny_tokenizer, tmp_path):
    from ctxext.recipe.schema import load_recipe
    from ctxext.training.data.corpus import prepare_data
    from ctxext.training.data.mixture import held_out_texts
    from tests.helpers.train import write_recipe

    path = write_recipe(
        tmp_path / "r.yaml",
        tmp_path / "out",
        data={"path": "builtin:stdlib", "max_documents": 40, "validation_fraction": 0.1},
        train={"seq_len": 128},
    )
    recipe = load_recipe(path)
    held = held_out_texts(recipe, tiny_tokenizer)
    data = prepare_data(recipe.data, tiny_tokenizer, 128, seed=recipe.train.seed)
    assert held and held == list(data.validation_documents["text"])
    assert not set(held) & set(data.train_documents["text"])
    recipe.data.validation_fraction = 0
    with pytest.raises(InputError, match="--data"):
        held_out_texts(recipe, tiny_tokenizer)


def test_the_report_shows_a_temperature_column_only_where_a_model_runs_with_one():
    from ctxext.artifacts.report import ModelEntry, ModelInfo, RopeInfo
    from ctxext.artifacts.tables import models_table

    rope = RopeInfo(rope_type="llama3", rope_theta=10000.0, original_length=64, current_length=256, factor=4.0)

    def entry(name: str, t: float | None) -> ModelEntry:
        return ModelEntry(name=name, model=ModelInfo(ref=name, attention_temperature=t), rope=rope)

    plain = "\n".join(models_table([entry("base", None), entry("run", 1.0)]))
    assert "attention temperature" not in plain
    shown = models_table([entry("base", None), entry("run", 1.2)])
    rows = [line for line in shown if line.startswith("| run ")]
    assert "attention temperature" in shown[0] and rows[0].rstrip(" |").endswith("1.2")


def test_calibrate_reads_the_runs_own_validation_documents_by_default(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run")
    result = runner.invoke(app, ["calibrate", str(run), "--temperatures", "1.2", *SMALL])
    assert result.exit_code == 0, result.output
    assert json.loads((run / CALIBRATION_FILE).read_text())["held_out"] == "the run's validation documents"
    # Without its recipe the run's held-out split is unknown: named, and the earlier record is left as it was.
    before = (run / CALIBRATION_FILE).read_bytes()
    (run / "recipe.yaml").unlink()
    result = runner.invoke(app, ["calibrate", str(run), "--overwrite", *SMALL])
    assert result.exit_code == 2 and "recipe.yaml" in flat(result) and "--data" in flat(result)
    assert (run / CALIBRATION_FILE).read_bytes() == before


SMALL_SECTION = {"trials": 2, "window_trials": 1, "depths": [0.0, 100.0], "windows": 8}


@pytest.mark.slow
def test_training_calibrates_by_default_when_it_is_cheap_and_says_so_when_it_is_not(tiny_run, tmp_path, capsys):
    from ctxext.artifacts.run import training_seconds
    from ctxext.cli.train_commands import calibrate_after_training
    from ctxext.recipe.calibration import CalibrateSection

    assert CalibrateSection().when == "auto" and CalibrateSection().max_share == 10.0  # the recipe's default
    run = copy_run(tiny_run, tmp_path / "run")
    trained = training_seconds(run)
    assert trained and trained > 0
    # Over its share of the training time: nothing measured, nothing written, the command to run it named.
    assert calibrate_after_training(run, CalibrateSection(max_share=1e-9, **SMALL_SECTION)) is None
    said = " ".join(capsys.readouterr().out.split())
    assert "not calibrating" in said and "calibrate.max_share" in said and f"ctxext calibrate {run}" in said
    assert not (run / CALIBRATION_FILE).exists()
    # Within it: calibrated on the run's validation documents, as `ctxext calibrate RUN` does.
    record = calibrate_after_training(run, CalibrateSection(max_share=1e9, **SMALL_SECTION))
    assert record is not None and json.loads((run / CALIBRATION_FILE).read_text()) == record
    assert record["held_out"] == "the run's validation documents"
    # A problem after training is a note under auto (the run is kept), an error when calibration is required.
    before = (run / CALIBRATION_FILE).read_bytes()
    assert calibrate_after_training(run, CalibrateSection(max_share=1e9, **SMALL_SECTION)) is None
    assert "note: not calibrated" in capsys.readouterr().err
    with pytest.raises(InputError, match="--overwrite"):
        calibrate_after_training(run, CalibrateSection(when="always", **SMALL_SECTION))
    assert (run / CALIBRATION_FILE).read_bytes() == before


@pytest.mark.slow
def test_ctxext_train_calibrates_the_run_before_its_eval_suite(tiny_model_dir, tmp_path):
    from tests.helpers.train import write_recipe

    suite = tmp_path / "suite.yaml"
    suite.write_text("name: s\nallow_beyond_context: true\nperplexity: {lengths: [256], max_docs: 3, resamples: 50}\n")
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        tmp_path / "run",
        model={"path": str(tiny_model_dir)},
        train={"max_steps": 2},
        calibrate={"when": "always", "temperatures": [1.5], **SMALL_SECTION},
        eval={"suite": str(suite)},
    )
    result = runner.invoke(app, ["train", str(recipe)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run" / CALIBRATION_FILE).read_text())
    assert [c["attention_temperature"] for c in record["candidates"]] == [1.0, 1.5]
    # The suite ran after it, on the run as it now loads (a run never calibrated reports no temperature).
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    assert report["models"][0]["model"]["attention_temperature"] == record["attention_temperature"]


@pytest.mark.slow
def test_loading_a_calibrated_run_hashes_its_weights_only_when_their_files_changed(tiny_run, tmp_path, monkeypatch):
    import os

    import ctxext.models.temperature as temperature

    run = copy_run(tiny_run, tmp_path / "run")
    result = runner.invoke(app, ["calibrate", str(run), "--temperatures", "1.2", *SMALL])
    assert result.exit_code == 0, result.output
    weights = run / "adapter_model.safetensors"
    real_digest = temperature.adapter_digest

    def no_hashing(run_dir):
        raise AssertionError("hashed the weights although their files are as measured")

    monkeypatch.setattr(temperature, "adapter_digest", no_hashing)
    assert read_calibration(run) is not None  # names, sizes and times as recorded: no read of the weights
    # Touched (a copy, a restore): hashed, and the same bytes are the same weights.
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    monkeypatch.setattr(temperature, "adapter_digest", real_digest)
    assert read_calibration(run) is not None
    # Trained further (other bytes): refused as stale.
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    with pytest.raises(InputError, match="trained further"):
        read_calibration(run)
