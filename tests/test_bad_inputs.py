"""One bad input per class: exit code 2, one message naming the problem and the fix, no traceback, and
nothing written at the output path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxext.cli.commands import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


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


def test_shipped_recipes_still_validate():
    for recipe in sorted((ROOT / "recipes").glob("*.yaml")):
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
