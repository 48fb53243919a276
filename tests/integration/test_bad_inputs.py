"""One bad input per class: exit code 2, one message naming the problem and the fix, no traceback, and
nothing written at the output path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ctxext.artifacts.lock import lock_path
from ctxext.cli.commands import app
from tests.helpers import ROOT
from tests.helpers.hub import copy_run, file_hashes, shared_run, write_calibration
from tests.helpers.train import ctxext_cmd, env

runner = CliRunner()


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture()
def world(tmp_path, tiny_model_dir, monkeypatch):
    """Files for every case: damaged models, bad data, a recipe writer. The working folder is tmp_path."""
    monkeypatch.chdir(tmp_path)
    trunc = tmp_path / "truncated"
    shutil.copytree(tiny_model_dir, trunc)
    blob = (trunc / "model.safetensors").read_bytes()
    (trunc / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    badcfg = tmp_path / "badcfg"
    shutil.copytree(tiny_model_dir, badcfg)
    (badcfg / "config.json").write_text('{"model_type": "llama", "hidden_size": 64,,}')
    for name, change in (("strtheta", {"rope_theta": "big"}), ("footype", {"rope_scaling": {"rope_type": "foo"}})):
        shutil.copytree(tiny_model_dir, tmp_path / name)
        data = json.loads((tmp_path / name / "config.json").read_text())
        data.pop("rope_parameters", None)
        data.update(change)
        (tmp_path / name / "config.json").write_text(json.dumps(data))
    (tmp_path / "latin.txt").write_bytes("def café():\n    return 'é'\n".encode("latin-1") * 50)
    (tmp_path / "latin.jsonl").write_bytes('{"text": "café au lait"}\n'.encode("latin-1"))
    (tmp_path / "numbers.jsonl").write_text('{"text": 123}\n{"text": 456}\n')
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"text": "def f(x):\n    return x\n" * 300}) + "\n" for _ in range(3))
    )
    (tmp_path / "afile").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "far.yaml").write_text("name: far\npasskey: {lengths: [128, 100000], depths: [50], trials: 1}\n")
    runs = tmp_path / "runs"
    runs.mkdir()

    def recipe(**sections: str) -> Path:
        body = {
            "model": f"  path: {tiny_model_dir}\n",
            "rope": "  method: yarn\n  target_length: 1024\n",
            "data": "  path: builtin:stdlib\n",
            "train": "  max_steps: 1\n  seq_len: 1024\n",
            "output": f"  dir: {tmp_path / 'out'}\n",
        }
        body.update(sections)
        path = tmp_path / "recipe.yaml"
        path.write_text("".join(f"{k}:\n{v}" for k, v in body.items()))
        return path

    return {"tmp": tmp_path, "model": tiny_model_dir, "recipe": recipe}


EXTEND = ["extend", "{model}", "-m", "yarn", "-t", "1024", "-o", "out"]
PPL = ["eval", "ppl", "--model", "{model}", "--lengths", "32", "--out", "out", "-q"]

CASES = {
    # class: (argv, recipe sections or None, words the message must hold)
    "corrupt weights (extend)": (
        ["extend", "truncated", "-m", "yarn", "-t", "1024", "-o", "out"],
        None,
        "truncated or corrupt",
    ),
    "corrupt weights (inspect)": (["inspect", "truncated"], None, "truncated or corrupt"),
    "corrupt weights (eval)": ([*PPL[:3], "truncated", *PPL[4:], "--data", "latin.txt"], None, "truncated or corrupt"),
    "invalid config.json (extend)": (
        ["extend", "badcfg", "-m", "yarn", "-t", "1024", "-o", "out"],
        None,
        "not valid JSON",
    ),
    "invalid config.json (inspect)": (["inspect", "badcfg", "--config-only"], None, "not valid JSON"),
    "invalid config.json (eval)": ([*PPL[:3], "badcfg", *PPL[4:], "--data", "latin.txt"], None, "not valid JSON"),
    "invalid config.json (train)": (["train", "{recipe}"], {"model": "  path: badcfg\n"}, "not valid JSON"),
    "config value of the wrong type": (["inspect", "strtheta", "--config-only"], None, "must be a finite number"),
    "unknown rope type": (["extend", "footype", "-m", "yarn", "-t", "1024", "-o", "out"], None, "unknown rope type"),
    "output is a file": ([*EXTEND[:-1], "afile"], None, "is a file"),
    "output is a dangling symbolic link": ([*EXTEND[:-1], "dangling"], None, "is a symbolic link to"),
    "target of 10^20 tokens": (
        ["extend", "{model}", "-m", "yarn", "-t", str(10**20), "-o", "out"],
        None,
        "--target-length 100000000000000000000: must be a number of tokens between 1 and 134,217,728",
    ),
    "recipe target of 10^20 tokens": (
        ["validate", "{recipe}"],
        {"rope": f"  method: yarn\n  target_length: {10**20}\n"},
        "rope.target_length",
    ),
    "a custom needle without its question": (
        ["eval", "needle", "--model", "{model}", "--lengths", "128", "--needle", "the code is 42", "--out", "out"],
        None,
        "needle given without question and answer: a custom needle needs all three",
    ),
    "output is the current folder": ([*PPL[:-2], ".", "-q", "--data", "latin.txt"], None, "current folder"),
    "output inside a file": ([*EXTEND[:-1], "afile/sub"], None, "is a file"),
    "yarn beta NaN": ([*EXTEND, "--beta-fast", "nan"], None, "beta_fast: must be a finite number > 0"),
    "yarn beta negative": ([*EXTEND, "--beta-slow", "-1"], None, "beta_slow: must be a finite number > 0"),
    "ntk alpha <= 1": (["extend", "{model}", "-m", "ntk", "-t", "1024", "--alpha", "0.5", "-o", "out"], None, "> 1"),
    "non-UTF-8 eval text": ([*PPL, "--data", "latin.txt"], None, "not UTF-8"),
    "non-UTF-8 eval table": (
        ["eval", "qa", "--model", "{model}", "--data", "latin.jsonl", "--out", "out"],
        None,
        "iconv",
    ),
    "text field not a string": ([*PPL, "--data", "numbers.jsonl"], None, "holds int values, not text"),
    "empty JSONL": ([*PPL, "--data", "empty.jsonl"], None, "holds no json records"),
    "lora.target_modules=[]": (["validate", "{recipe}"], {"lora": "  target_modules: []\n"}, "at least one module"),
    "unknown key names --schema": (["validate", "{recipe}"], {"lora": "  rr: 4\n"}, "ctxext validate --schema"),
    "mixture corpus missing": (
        ["validate", "{recipe}"],
        {"data": "  mixture:\n    - {path: nope/x.jsonl, weight: 1}\n    - {task: needle, weight: 1}\n"},
        "data.mixture[0].path",
    ),
    "eval.suite missing": (["validate", "{recipe}"], {"eval": "  suite: eval/nope.yaml\n"}, "eval.suite"),
    "hub.repo_id invalid": (["validate", "{recipe}"], {"hub": "  repo_id: not a repo\n"}, "not a Hub repository id"),
    "already-scaled model": (["validate", "{recipe}"], {"model": "  path: out-scaled\n"}, "--relative-to"),
    "local path misread as Hub id": (["inspect", "runs/my-run", "--config-only"], None, "no folder runs/my-run"),
    "non-UTF-8 training data": (["train", "{recipe}"], {"data": "  path: latin.jsonl\n"}, "not UTF-8"),
    "too little data for one micro-batch": (
        ["train", "{recipe}"],
        {
            "data": "  path: docs.jsonl\n",
            "quantization": "  mode: none\n",
            "train": "  max_steps: 1\n  seq_len: 1024\n  micro_batch_size: 1000\n",
        },
        "cannot fill one micro-batch",
    ),
    "validate: missing data file": (["validate", "{recipe}"], {"data": "  path: ./nope.jsonl\n"}, "does not exist"),
    "validate: damaged weights": (["validate", "{recipe}"], {"model": "  path: truncated\n"}, "truncated or corrupt"),
    # Values that once divided by zero, planned negative hours or checked nothing: refused where first read.
    "original length 0 (extend)": (
        [*EXTEND, "--original-length", "0"],
        None,
        "--original-length 0: must be a positive",
    ),
    "original length 0 (inspect)": (
        ["inspect", "{model}", "--config-only", "--original-length", "0"],
        None,
        "positive",
    ),
    "original length 0 (validate)": (
        ["validate", "{recipe}"],
        {"model": "  path: {model}\n  original_length: 0\n"},
        "model.original_length",
    ),
    "negative TFLOP/s": (
        ["plan", "{recipe}", "--gpu-memory", "80GB", "--tflops", "-5"],
        None,
        "--tflops -5.0: must be",
    ),
    "merge --sequences 0": (["merge", "runs", "--out", "out", "--sequences", "0"], None, "--sequences 0: must be"),
    "unknown device": (
        ["eval", "passkey", "--model", "{model}", "--lengths", "64", "--out", "out", "--device", "tpu"],
        None,
        "--device tpu: not a device name",
    ),
    "longrope factor below 1": (
        ["extend", "{model}", "-m", "longrope", "-t", "1024", "-o", "out", "--short-factor", "1,1,1,1,1,1,1,1"]
        + ["--long-factor", "0.5,1,1,1,1,1,1,1"],
        None,
        "long_factor: every rescale factor must be >= 1",
    ),
    "longrope factor below 1 (validate)": (
        ["validate", "{recipe}"],
        {
            "rope": "  method: longrope\n  target_length: 1024\n  short_factor: [0.9, 1, 1, 1, 1, 1, 1, 1]\n"
            "  long_factor: [1, 1, 1, 1, 1, 1, 1, 1]\n"
        },
        "short_factor: every rescale factor must be >= 1",
    ),
    "suite length 390x the context": (
        ["eval", "run", "far.yaml", "--model", "{model}", "--out", "out"],
        None,
        "passkey: length 100,000 is 391x the reference context 256; lengths past 8x it (2,048 tokens) are refused",
    ),
    "mixture weight NaN": (
        ["validate", "{recipe}"],
        {"data": "  mixture:\n    - {path: builtin:stdlib, weight: .nan}\n"},
        "data.mixture.0.weight: Input should be a finite number",
    ),
    "mixture weight inf": (
        ["validate", "{recipe}"],
        {"data": "  mixture:\n    - {path: builtin:stdlib, weight: .inf}\n"},
        "data.mixture.0.weight: Input should be a finite number",
    ),
    "mixture templates: []": (
        ["validate", "{recipe}"],
        {
            "data": "  mixture:\n    - {path: builtin:stdlib, weight: 1}\n"
            "    - {task: passkey, weight: 1, templates: []}\n"
        },
        "templates: empty",
    ),
}

# Keys that were silently ignored: refused by `train` and reported by `validate`, each naming its key.
IGNORED_KEYS = {
    "data.path beside data.mixture": (
        {"data": "  path: builtin:stdlib\n  mixture:\n    - {path: builtin:stdlib, weight: 1}\n"},
        "data.path: 'builtin:stdlib' would be ignored: with data.mixture",
    ),
    "a key given twice": (
        {"train": "  max_steps: 1\n  seq_len: 1024\n  max_steps: 5\n"},
        "train.max_steps: given twice (lines 9 and 11)",
    ),
    "a task sample longer than a row": (
        {
            "data": "  mixture:\n    - {path: builtin:stdlib, weight: 1}\n"
            "    - {task: needle, weight: 1, min_length: 2048}\n"
        },
        "data.mixture.1.min_length: 2048 is longer than train.seq_len (1024)",
    ),
}
for _name, (_sections, _words) in IGNORED_KEYS.items():
    for _command in ("train", "validate"):
        CASES[f"{_name} ({_command})"] = ([_command, "{recipe}"], _sections, _words)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_clear_message(case, world):
    argv, sections, words = CASES[case]
    tmp = world["tmp"]
    if case == "already-scaled model":
        assert (
            runner.invoke(
                app, ["extend", str(world["model"]), "-m", "linear", "-t", "512", "-o", "out-scaled"]
            ).exit_code
            == 0
        )
    recipe = world["recipe"](**(sections or {})) if "{recipe}" in argv else None
    args = [a.replace("{model}", str(world["model"])).replace("{recipe}", str(recipe)) for a in argv]
    if recipe is not None:
        recipe.write_text(recipe.read_text().replace("{model}", str(world["model"])))
    result = runner.invoke(app, args)
    output = flat(result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert words in output, result.output
    assert "Traceback" not in result.output
    # Nothing half-written: no output folder, no temporary folder beside it.
    assert not (tmp / "out").exists()
    assert not [p.name for p in tmp.iterdir() if p.name.startswith(".out")]


def test_seq_len_warnings(world):
    recipe = world["recipe"](train="  max_steps: 1\n  seq_len: 256\n")
    result = runner.invoke(app, ["validate", str(recipe)])
    assert result.exit_code == 0 and "at or below the model's original context 256" in flat(result.output)
    recipe = world["recipe"](rope="  method: none\n", train="  max_steps: 1\n  seq_len: 1024\n")
    result = runner.invoke(app, ["validate", str(recipe)])
    assert result.exit_code == 0 and "unscaled RoPE" in flat(result.output), result.output
    result = runner.invoke(app, ["validate", "--schema"])
    assert result.exit_code == 0 and "rope.relative_to" in result.output and "lora.target_modules" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_recipes_still_validate(recipe):
    # The whole of `ctxext validate` (plan, task previews with the model's tokenizer): 4-10 s per recipe.
    result = runner.invoke(app, ["validate", str(recipe)])
    assert result.exit_code == 0, (recipe, result.output)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine where CUDA is absent")
def test_cuda_where_there_is_none(world):
    for argv in (
        ["eval", "passkey", "--model", str(world["model"]), "--lengths", "64", "--out", "out", "--device", "cuda"],
        ["merge", "runs", "--out", "out", "--device", "cuda"],
    ):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, result.output
        assert "--device cuda: " in flat(result.output) and "use --device cpu" in flat(result.output)
        assert "Traceback" not in result.output and not (world["tmp"] / "out").exists()


def test_keys_given_twice_are_found_at_any_depth(tmp_path):
    from ctxext.errors import InputError
    from ctxext.evaluation.suite import load_suite
    from ctxext.recipe.yamlfile import DuplicateKeyError, load_yaml

    text = "a:\n  b: 1\n  c: [{d: 1, d: 2}]\n  b: 3\n<<: {x: 1}\ne: 1\n"
    with pytest.raises(DuplicateKeyError) as err:
        load_yaml(text)
    assert err.value.duplicates == [("a.c.0.d", 3, 3), ("a.b", 2, 4)]
    assert load_yaml("a: {b: 1}\nc: {b: 2}\n") == {"a": {"b": 1}, "c": {"b": 2}}  # the same key in two mappings
    # Eval suites are read the same way.
    (tmp_path / "suite.yaml").write_text("name: x\nperplexity: {lengths: [32]}\nname: y\n")
    with pytest.raises(InputError, match=r"name: given twice \(lines 1 and 3\)"):
        load_suite(tmp_path / "suite.yaml")


def test_a_large_grid_prints_its_work_first(world):
    args = ["eval", "passkey", "--model", str(world["model"]), "--lengths", "100000", "--trials", "4", "--out", "out"]
    result = runner.invoke(app, args)
    output = flat(result.output)
    # 5 depths × 4 trials at 100,000 tokens: said before the model loads; the length is then refused (no flag).
    assert "note: passkey: 1 length(s) × 20 sequence(s) = 20 sequences, 2,000,000 tokens per model" in output
    assert result.exit_code == 2 and "--allow-beyond-context" in output
    small = runner.invoke(app, [*args[:5], "256", "--depths", "50", "--trials", "1", "--out", "out", "-q"])
    assert small.exit_code == 0 and "note:" not in small.output, small.output


# ---------------------------------------------------------------------------------------------------------------
# Inputs that need a trained run, a second process or a file made by hand: one row each, (command, a setup that
# makes the bad input under tmp_path and returns the {name} fields of the command, exit code, words of the message).
# Every row checks: that exit code, the words, no traceback, no "--force" offered where the command has none, and
# that nothing was written or lost (the run folder's files are byte-for-byte as the setup left them, no --out).


@dataclass(frozen=True)
class Row:
    """A bad invocation, the setup that makes its bad input, and what the answer must be."""

    args: list[str]
    setup: Callable[[Path, Path], dict[str, str]]
    code: int
    words: str
    absent: tuple[str, ...] = ()


def _run_copy(tmp: Path, run: Path, **changes: Any) -> Path:
    return copy_run(run, tmp / "run", **changes)


def _truncate(path: Path) -> None:
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])


def truncated_adapter(tmp: Path, run: Path) -> dict[str, str]:
    _truncate(_run_copy(tmp, run) / "adapter_model.safetensors")
    return {"run": str(tmp / "run")}


def truncated_adapter_config(tmp: Path, run: Path) -> dict[str, str]:
    _truncate(_run_copy(tmp, run) / "adapter_config.json")
    return {"run": str(tmp / "run")}


def incomplete_run(tmp: Path, run: Path) -> dict[str, str]:
    _run_copy(tmp, run, status="interrupted")
    return {"run": str(tmp / "run")}


def edited_temperature(tmp: Path, run: Path) -> dict[str, str]:
    folder = write_calibration(_run_copy(tmp, run), 1.2)
    record = json.loads((folder / "calibration.json").read_text())
    record["attention_temperature"] = 5.0
    (folder / "calibration.json").write_text(json.dumps(record))
    return {"run": str(folder)}


def record_without_digest(tmp: Path, run: Path) -> dict[str, str]:
    folder = write_calibration(_run_copy(tmp, run), 1.2)
    record = json.loads((folder / "calibration.json").read_text())
    del record["adapter"]
    (folder / "calibration.json").write_text(json.dumps(record))
    return {"run": str(folder)}


def run_being_written(tmp: Path, run: Path) -> dict[str, str]:
    """The run folder's lock held by another live process (a calibrate, a train resuming), as two commands would."""
    folder = _run_copy(tmp, run)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(folder)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    HOLDERS.append(holder)
    return {"run": str(folder)}


HOLD_LOCK = (
    "import sys, time\nfrom ctxext.artifacts.lock import folder_lock\n"
    "with folder_lock(sys.argv[1], flag='RUN', command='ctxext calibrate RUN'):\n"
    "    print('locked', flush=True)\n    time.sleep(120)\n"
)
HOLDERS: list[subprocess.Popen] = []


def damaged_run_record(tmp: Path, run: Path) -> dict[str, str]:
    (_run_copy(tmp, run) / "run.json").write_text('{"status": "compl')
    return {"run": str(tmp / "run")}


def a_run(tmp: Path, run: Path) -> dict[str, str]:
    return {"run": str(_run_copy(tmp, run))}


def moved_export_without_data(tmp: Path, run: Path) -> dict[str, str]:
    result = runner.invoke(
        app, ["tasks", "export", str(tmp / "ex"), "--model", "builtin:tiny-llama", "--tasks", "needle"]
        + ["--lengths", "128", "--trials", "1", "--depths", "50"]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (tmp / "ex").rename(tmp / "moved")
    (tmp / "moved" / "ctxext_needle_128.jsonl").unlink()
    return {"export": str(tmp / "moved")}


def an_export(tmp: Path, run: Path) -> dict[str, str]:
    (tmp / "ex").mkdir()
    (tmp / "ex" / "mine.txt").write_text("a file the user made")
    return {"export": str(tmp / "ex")}


SMALL_CALIBRATION = ["--trials", "1", "--window-trials", "1", "--depths", "50", "--windows", "2"]
DAMAGED = "train again or restore the file"
HARNESS = ["eval", "harness", "--model", "builtin:tiny-llama", "--out", "{tmp}/out", "--tasks", "needle"]
HARNESS += ["--lengths", "128"]
ROWS = {
    # A truncated adapter: one message naming the file, from the one loader (and merge's and push's checks).
    "truncated adapter (eval)": Row(
        ["eval", "ppl", "--model", "{run}", "--lengths", "32", "--out", "{tmp}/out", "-q", "--data", "builtin:stdlib"],
        truncated_adapter,
        2,
        "adapter_model.safetensors cannot be read",
    ),
    "truncated adapter (calibrate)": Row(["calibrate", "{run}"], truncated_adapter, 2, DAMAGED),
    "truncated adapter (export)": Row(
        ["export", "{run}", "--for", "vllm", "--out", "{tmp}/out"], truncated_adapter, 2, DAMAGED
    ),
    "truncated adapter (merge)": Row(["merge", "{run}", "--out", "{tmp}/out"], truncated_adapter, 2, DAMAGED),
    "truncated adapter (push --dry-run)": Row(
        ["push", "{run}", "--repo-id", "me/x", "--dry-run"], truncated_adapter, 2, "adapter_model.safetensors"
    ),
    "truncated adapter_config.json (push --dry-run)": Row(
        ["push", "{run}", "--repo-id", "me/x", "--dry-run"], truncated_adapter_config, 2, "JSON file"
    ),
    "damaged run.json (eval)": Row(
        ["eval", "ppl", "--model", "{run}", "--lengths", "32", "--out", "{tmp}/out", "-q", "--data", "builtin:stdlib"],
        damaged_run_record,
        2,
        "run.json cannot be read as JSON",
    ),
    "damaged run.json (calibrate)": Row(["calibrate", "{run}"], damaged_run_record, 2, "run.json cannot be read"),
    # Commands without --force do not offer it for an unfinished run.
    "unfinished run (calibrate)": Row(["calibrate", "{run}"], incomplete_run, 2, "--resume", ("--force",)),
    "unfinished run (export)": Row(
        ["export", "{run}", "--for", "vllm", "--out", "{tmp}/out"], incomplete_run, 2, "--resume", ("--force",)
    ),
    "unfinished run (merge offers --force)": Row(
        ["merge", "{run}", "--out", "{tmp}/out"], incomplete_run, 2, "--force"
    ),
    # calibration.json: a hand-edited temperature, a missing digest.
    "hand-edited temperature (eval)": Row(
        ["eval", "ppl", "--model", "{run}", "--lengths", "32", "--out", "{tmp}/out", "-q", "--data", "builtin:stdlib"],
        edited_temperature,
        2,
        "attention_temperature 5 is not one of the temperatures it measured",
    ),
    "hand-edited temperature (merge)": Row(
        ["merge", "{run}", "--out", "{tmp}/out"], edited_temperature, 2, "edited by hand"
    ),
    "calibration without its adapter digest": Row(
        ["merge", "{run}", "--out", "{tmp}/out"], record_without_digest, 2, "does not record the weights"
    ),
    # Two writers of one run folder.
    "calibrate while another command writes the run": Row(
        ["calibrate", "{run}", "--data", "builtin:stdlib-train", *SMALL_CALIBRATION],
        run_being_written,
        2,
        "another ctxext command is writing there",
    ),
    # Counts of the wrong type or out of range.
    "calibrate --trials x": Row(["calibrate", "{run}", "--trials", "x"], a_run, 2, "--trials"),
    "calibrate --trials 0": Row(["calibrate", "{run}", "--trials", "0"], a_run, 2, "--trials"),
    "eval harness --trials -1": Row([*HARNESS, "--trials", "-1"], a_run, 2, "--trials: Input should be greater"),
    "eval harness --trials x": Row([*HARNESS, "--trials", "x"], a_run, 2, "--trials"),
    "eval harness --limit -3": Row([*HARNESS, "--limit", "-3"], a_run, 2, "--limit"),
    "eval harness --batch-size 0": Row([*HARNESS, "--batch-size", "0"], a_run, 2, "--batch-size"),
    # An export whose documents are gone (moved without them): refused, naming the file.
    "exported tasks without their data": Row(
        ["eval", "harness", "--model", "builtin:tiny-llama", "--out", "{tmp}/out", "--include-path", "{export}"]
        + ["--tasks", "ctxext_needle"],
        moved_export_without_data,
        2,
        "ctxext_needle_128.jsonl missing",
    ),
    # A positional argument is named as such, not as a --out that does not exist.
    "tasks export into a user's folder": Row(
        ["tasks", "export", "{export}", "--model", "builtin:tiny-llama", "--tasks", "needle", "--lengths", "128"],
        an_export,
        2,
        "choose another OUT",
        ("--out",),
    ),
    # A removed flag names its replacement.
    "demo --model (removed)": Row(["demo", "--model", "x", "--out", "{tmp}/out"], a_run, 2, "use model.path=x"),
    # The sweep: missing, empty, a folder for a file, a file for a folder.
    "calibrate a file": Row(["calibrate", "{tmp}/run/run.json"], a_run, 2, "is a file, not a folder"),
    "merge a file": Row(["merge", "{tmp}/run/run.json", "--out", "{tmp}/out"], a_run, 2, "is a file, not a folder"),
    "export a missing folder": Row(["export", "{tmp}/nope", "--for", "vllm"], a_run, 2, "nope does not exist"),
    "calibrate --data missing": Row(["calibrate", "{run}", "--data", "{tmp}/nope.txt"], a_run, 2, "does not exist"),
    "eval run a folder": Row(
        ["eval", "run", "{tmp}", "--model", "{run}", "--out", "{tmp}/out"], a_run, 2, "is a folder, not a suite"
    ),
    "train a folder": Row(["train", "{tmp}"], a_run, 2, "is a folder, not a recipe"),
    "validate a folder": Row(["validate", "{tmp}"], a_run, 2, "is a folder, not a recipe"),
    "push a missing folder": Row(["push", "{tmp}/nope", "--repo-id", "me/x", "--dry-run"], a_run, 2, "does not exist"),
}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_model_dir) -> Path:
    return shared_run(tmp_path_factory, tiny_model_dir)


@pytest.mark.parametrize("name", list(ROWS))
def test_bad_input_row(name, trained_run, tmp_path, monkeypatch):
    row = ROWS[name]
    monkeypatch.chdir(tmp_path)
    fields = {"tmp": str(tmp_path), **row.setup(tmp_path, trained_run)}
    before = file_hashes(tmp_path)
    try:
        result = runner.invoke(app, [a.format(**fields) for a in row.args])
    finally:
        while HOLDERS:
            HOLDERS.pop().kill()
    output = flat(result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == row.code, result.output
    assert row.words in output, result.output
    assert "Traceback" not in result.output and output.count("error:") <= 1, result.output
    assert not any(word in output for word in row.absent), result.output
    # Nothing written, nothing lost: every file as the setup left it, no output, no temporary folder or lock.
    after = {k: v for k, v in file_hashes(tmp_path).items() if not k.endswith(".ctxext-lock")}
    assert after == {k: v for k, v in before.items() if not k.endswith(".ctxext-lock")}


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` read-only for this process: its mode bits, or for root (whom they do not stop) a read-only bind
    mount of it onto itself (skipped where mounting is not allowed)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    done = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"root ignores mode bits and cannot bind-mount here: {done.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=False, capture_output=True)


def test_calibrate_refuses_a_read_only_run_before_the_work(trained_run, tmp_path):
    run = copy_run(trained_run, tmp_path / "run")
    with read_only(run):
        result = runner.invoke(app, ["calibrate", str(run), "--data", "builtin:stdlib-train", *SMALL_CALIBRATION])
    assert result.exit_code == 2 and "cannot write there" in flat(result.output), result.output
    assert not (run / "calibration.json").exists()


@pytest.mark.slow
def test_a_moved_export_reads_its_own_documents(tmp_path, monkeypatch):
    """The task YAML names its data relative to itself: lm-eval loads the moved copy's documents, from anywhere."""
    from lm_eval.tasks import TaskManager, get_task_dict

    from ctxext.evaluation.export_tasks import read_task_config

    args = ["--model", "builtin:tiny-llama", "--tasks", "needle", "--lengths", "128", "--trials", "1"]
    assert runner.invoke(app, ["tasks", "export", str(tmp_path / "ex"), *args]).exit_code == 0
    (tmp_path / "ex").rename(tmp_path / "moved")
    config = read_task_config(tmp_path / "moved" / "ctxext_needle_128.yaml")
    assert str(tmp_path) not in json.dumps(config)  # no absolute path left in the task file
    docs = [json.loads(line) for line in (tmp_path / "moved" / "ctxext_needle_128.jsonl").read_text().splitlines()]
    monkeypatch.chdir(ROOT)  # a working folder unrelated to the export
    task = get_task_dict(["ctxext_needle_128"], TaskManager(include_path=str(tmp_path / "moved")))
    loaded = list(task["ctxext_needle_128"].test_docs())
    assert [d["prompt"] for d in loaded] == [d["prompt"] for d in docs]


@pytest.mark.slow
def test_two_calibrations_of_one_run_at_once(trained_run, tmp_path):
    """Two real processes: the second is refused while the first holds the run folder; the first's record stays."""
    run = copy_run(trained_run, tmp_path / "run")
    cmd = ctxext_cmd("calibrate", str(run), "--data", "builtin:stdlib-train", *SMALL_CALIBRATION)
    first = subprocess.Popen(cmd, env=env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lock = lock_path(run)
    deadline = time.time() + 120
    while not lock.exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    second = subprocess.run(cmd, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=240)
    out, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out
    assert second.returncode == 2, second.stderr
    assert "another ctxext command is writing there" in flat(second.stderr), second.stderr
    assert "Traceback" not in second.stderr
    record = json.loads((run / "calibration.json").read_text())
    assert record["attention_temperature"] == 1.0 and not lock.exists()


# A suite whose first section is done in a second and whose second takes minutes even on quiet cores (400
# sequences of 16k tokens on the tiny model), so a stop 40 s in lands in the second on a busy machine too.
TWO_SECTIONS = """
name: stop-test
allow_beyond_context: true
perplexity: {data: builtin:stdlib, lengths: [128], max_docs: 4, resamples: 10}
needle: {haystack: builtin:stdlib, lengths: [16384], depths: [50], trials: 400}
"""


def _terminate_during(cmd: list[str], tmp_path: Path, out: Path, wait_s: float) -> tuple[int, str, float]:
    """Start ``cmd``, send SIGTERM ``wait_s`` after it takes ``out``'s lock; ``(exit code, output, seconds to exit)``.

    (Progress lines come every 30 s of work without a terminal, so the time since the lock says where it is.)
    """
    log = tmp_path / "output.txt"
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=env(), cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 120
        while not lock_path(out).exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert lock_path(out).exists(), log.read_text()
        time.sleep(wait_s)
        assert proc.poll() is None, log.read_text()
        proc.terminate()
        sent = time.time()
        proc.wait(timeout=120)
    text = log.read_text()
    log.unlink()
    return proc.returncode, text, time.time() - sent


@pytest.mark.slow
def test_sigterm_stops_an_evaluation_mid_work_and_leaves_nothing_half_written(tmp_path):
    """SIGTERM during an evaluation's first section: exit 143 within the running operation, and nothing written:
    no report (nothing completed), no temporary folder, no lock."""
    cmd = ctxext_cmd("eval", "ppl", "--model", "builtin:tiny-llama", "--lengths", "16384", "--allow-beyond-context")
    cmd += ["--data", "builtin:stdlib-long", "--out", str(tmp_path / "out")]
    code, err, waited = _terminate_during(cmd, tmp_path, tmp_path / "out", 8)  # into the long forwards
    assert code == 143, err
    assert waited < 60, "SIGTERM waited for the whole evaluation"
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no report, no .out.tmp-*, no lock


@pytest.mark.slow
def test_sigterm_writes_the_sections_that_completed_marked_incomplete(tmp_path):
    """SIGTERM in a suite's second section: the first section's results are written whole, as a report that says
    it is incomplete and what it did not reach; still exit 143, no temporary folder, no lock."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(TWO_SECTIONS)
    cmd = ctxext_cmd("eval", "run", str(suite), "--model", "builtin:tiny-llama", "--out", str(tmp_path / "out"))
    # The perplexity section takes about a second (loading included: ~15 s with four processes on two cores), the
    # needle's 400 trials at 16k several minutes.
    code, err, waited = _terminate_during(cmd, tmp_path, tmp_path / "out", 40)
    assert code == 143 and waited < 60, err
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "suite.yaml"]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["suite"]["interrupted"].startswith("stopped by SIGTERM; not evaluated: needle")
    (model,) = report["models"]
    assert model.get("perplexity") and not model.get("needle")
    assert "**Incomplete: stopped by SIGTERM" in (tmp_path / "out" / "report.md").read_text()


# Commands that write a new folder inside a read-only one: refused with the folder named, before any work.
READ_ONLY_OUTPUTS = {
    "extend": ["extend", "{model}", "-m", "yarn", "-t", "1024", "-o", "{ro}/out"],
    "eval ppl": ["eval", "ppl", "--model", "{model}", "--lengths", "32", "--out", "{ro}/report", "-q"],
    "tasks export": ["tasks", "export", "{ro}/tasks", "--model", "{model}", "--tasks", "passkey", "--lengths", "256"],
    "search": ["search", "{model}", "-t", "512", "--out", "{ro}/searched"],
}


@pytest.mark.parametrize("command", list(READ_ONLY_OUTPUTS))
def test_an_output_in_a_read_only_folder_is_refused(command, tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    args = [a.format(model=tiny_model_dir, ro=ro) for a in READ_ONLY_OUTPUTS[command]]
    with read_only(ro):
        result = runner.invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert str(ro) in flat(result.output) and "Traceback" not in result.output, result.output
    assert list(ro.iterdir()) == []
