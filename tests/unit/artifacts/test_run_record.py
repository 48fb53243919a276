"""The run record (``run.json``) as a typed model: written and read one way, records of earlier versions read as they
are, and a damaged record refused by every command that reads it with one message naming the file (exit code 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxext.artifacts.run import MergedRecord, RunRecord, plan_from_run, read_merged, read_run, run_base_model
from ctxext.cli.commands import app
from ctxext.errors import InputError
from ctxext.recipe.memory import Levers
from tests.helpers.train import write_fake_run

runner = CliRunner()

# What the first `ctxext train` wrote (no fingerprint, memory levers, mixture, search, initial loss or error).
FIRST_VERSION = {
    "status": "complete",
    "base_model": "builtin:tiny-llama",
    "base_model_resolved": "/nowhere/tiny-llama",
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 256},
    "original_length": 256,
    "target_length": 1024,
    "method": "yarn",
    "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
    "extra_trainable": ["model.embed_tokens", "model.norm"],
    "trainable_params": 123,
    "attn_implementation": "sdpa",
    "compute_dtype": "float32",
    "seq_len": 1024,
    "quantization": "nf4",
    "num_processes": 1,
    "steps": 10,
    "tokens_seen": 20480,
    "final_train_loss": 5.5,
    "final_val_loss": 5.75,
}


def test_round_trip_keeps_every_field_and_fields_it_does_not_know(tmp_path):
    record = RunRecord(
        status="running",
        base_model="builtin:tiny-llama",
        method="yarn",
        target_length=1024,
        original_length=256,
        memory=Levers(residual_dtype="fp32", tiled_mlp=0),
        search={"folder": "s", "score": 0.9},
        added_by_a_newer_version={"x": 1},
    )
    record.write(tmp_path)
    written = json.loads((tmp_path / "run.json").read_text())
    assert written["added_by_a_newer_version"] == {"x": 1} and "folder" not in written
    assert written["memory"] == {"residual_dtype": "fp32", "offload_checkpoints": False, "tiled_mlp": 0,
                                 "expandable_segments": False}  # fmt: skip
    assert not list(tmp_path.glob(".*tmp*"))  # written through a temporary file, renamed
    back = RunRecord.read(tmp_path)
    assert back.folder == tmp_path.resolve() and back.memory == record.memory and back.factor == 4.0
    assert back.model_dump() == record.model_dump()
    back.status = "complete"
    back.write(tmp_path / "run.json")
    assert read_run(tmp_path).complete
    with pytest.raises(ValueError):
        back.status = "finished"  # type: ignore[assignment]  # assignments are validated


def test_a_record_of_the_first_version_reads_as_it_is(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({**FIRST_VERSION, "run_dir": "/old/place"}))
    run = read_run(tmp_path)
    assert run.base_fingerprint is None and run.memory is None and run.mixture is None and run.search is None
    assert run.lora is not None and run.lora.r == 8 and run.lora.target_modules == ["q_proj", "v_proj"]
    assert run.model_extra == {"run_dir": "/old/place"}  # kept, and written back unchanged
    # The resolved base no longer exists: the base is the one the recipe named.
    assert run_base_model(run) == run_base_model(tmp_path) == "builtin:tiny-llama"
    run.write(tmp_path)
    assert json.loads((tmp_path / "run.json").read_text())["run_dir"] == "/old/place"


def test_a_merged_folder_written_before_the_typed_record(tmp_path, tiny_model_dir):
    # ctxext merge wrote the run's dict with its run_dir inside, and no source_run of its own at first.
    old = {"run": {**FIRST_VERSION, "run_dir": "/runs/r"}, "smoke": {"ok": True, "max_abs_diff": 1e-6}}
    (tmp_path / "ctxext_merge.json").write_text(json.dumps(old))
    merged = read_merged(tmp_path)
    assert merged.run.folder == Path("/runs/r") and merged.smoke["ok"] and merged.source_run is None
    # What merge writes now: the source run named by the merge record itself.
    (tmp_path / "new").mkdir()
    MergedRecord(run=merged.run, smoke=merged.smoke, source_run="/runs/moved").write(tmp_path / "new")
    again = read_merged(tmp_path / "new")
    assert again.run.folder == Path("/runs/moved") and again.run.steps == 10 and again.smoke == merged.smoke
    (tmp_path / "ctxext_merge.json").write_text(json.dumps({"run": {"status": "complete"}}))
    with pytest.raises(InputError, match=r"ctxext_merge.json \(its 'run' section\) lacks base_model"):
        read_merged(tmp_path)


def test_plan_from_a_record(tiny_model_dir):
    from ctxext.models.sources import config_from_folder

    run = RunRecord.model_validate(FIRST_VERSION)
    plan = plan_from_run(run, config_from_folder(tiny_model_dir))
    assert plan is not None and plan.factor == 4.0 and plan.max_position_embeddings == 1024
    assert plan_from_run(run.model_copy(update={"method": "none"}), config_from_folder(tiny_model_dir)) is None


# Damaged records: what each looks like, and words of the message.
DAMAGE = {
    "truncated": ('{"status": "complete", "base_model": "x", "meth', "cannot be read as JSON"),
    "empty": ("", "cannot be read as JSON"),
    "not an object": ("[1, 2]", "must hold a JSON object"),
    "a required field missing": (json.dumps({"status": "complete", "base_model": "x"}), "lacks method, target_length"),
    "a wrong type": (json.dumps({**FIRST_VERSION, "target_length": "long"}), "target_length"),
    "an unknown status": (json.dumps({**FIRST_VERSION, "status": "finished"}), "status"),
    "not UTF-8": (b"\xff\xfe\x00garbage", "cannot be read as JSON"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_record_is_one_message_naming_the_file(damage, tmp_path):
    content, words = DAMAGE[damage]
    file = tmp_path / "run.json"
    file.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InputError) as err:
        RunRecord.read(tmp_path)
    assert str(file) in str(err.value) and words in str(err.value), err.value
    assert "\n" not in str(err.value) and "Traceback" not in str(err.value)


# Every command that reads a run folder, with its arguments ({run}: the run folder, {out}: a new folder).
COMMANDS = {
    "eval ppl": ["eval", "ppl", "--model", "{run}", "--data", "{text}", "--lengths", "32", "-o", "{out}"],
    "merge": ["merge", "{run}", "--out", "{out}"],
    "push --dry-run": ["push", "{run}", "--repo-id", "me/model", "--dry-run"],
    "calibrate": ["calibrate", "{run}"],
    "train --resume": ["train", "{run}/recipe.yaml", "output.dir={run}", "--resume"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("damage", ["truncated", "a wrong type"])
def test_every_command_refuses_a_damaged_record_with_exit_2(command, damage, tmp_path, tiny_model_dir):
    from tests.helpers.train import write_recipe

    run_dir = write_fake_run(tmp_path / "run", tiny_model_dir)
    write_recipe(run_dir / "recipe.yaml", run_dir, model={"path": str(tiny_model_dir)})
    shutil.copy(tiny_model_dir / "config.json", run_dir / "config.json")
    (run_dir / "run.json").write_text(DAMAGE[damage][0])
    before = sorted(p.name for p in run_dir.iterdir())
    text = tmp_path / "doc.txt"
    text.write_text("def f(x):\n    return x\n" * 200)
    args = [a.format(run=run_dir, out=tmp_path / "out", text=text) for a in COMMANDS[command]]
    result = runner.invoke(app, args)
    output = " ".join(result.output.split())
    assert result.exit_code == 2, (command, result.output)
    assert f"{run_dir / 'run.json'}" in output and DAMAGE[damage][1] in output, (command, output)
    assert "Traceback" not in result.output
    assert sorted(p.name for p in run_dir.iterdir()) == before and not (tmp_path / "out").exists()
