"""Grown bases of other shapes than Llama: Qwen2 / Mistral (GQA) and GPT-NeoX (partial rotary).

The builder grows each shape (here a few steps of a one-layer model on five stdlib files), and what a user
then runs on it works: ``ctxext extend`` (RoPE patched and verified on the rotary dimensions only for
NeoX), a 2-step QLoRA ``ctxext train`` (NeoX with its own module names, which a refusal proposes) and
``ctxext eval needle``. The default shape is still exactly the Llama the packaged base was grown as.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.errors import InputError
from ctxext.models.builtin import GROWN_DIR, RESOURCES
from ctxext.models.grown import GrowSettings, build_model, grow, split_files
from ctxext.models.sources import resolve_model_path
from ctxext.rope.read import read_rope
from ctxext.rope.runtime import verify_model_rope
from tests.helpers import ROOT

TINY = dict(vocab_size=320, hidden=32, intermediate=64, layers=1, steps=2, batch=2, warmup=1, stage2_steps=0)
NEOX_LORA = [
    "lora.target_modules=[query_key_value,dense,dense_h_to_4h,dense_4h_to_h]",
    "lora.extra_trainable=[embed_in,norm]",
]


@pytest.fixture(scope="module")
def few_files():
    root, train, heldout = split_files(10)
    small = sorted((p for p in train if 2_000 < p.stat().st_size < 8_000), key=lambda p: p.as_posix())
    return root, small[:5], [p for p in heldout if 2_000 < p.stat().st_size < 20_000][:2]


def run(*args: str):
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "300"})
    assert "Traceback" not in result.output
    return result


@pytest.mark.skipif(not (GROWN_DIR / "config.json").is_file(), reason="grown-code-64 is not packaged")
def test_default_shape_is_the_llama_the_packaged_base_was_grown_as(tmp_path):
    from transformers import AutoTokenizer

    model = build_model(GrowSettings(), AutoTokenizer.from_pretrained(GROWN_DIR))
    model.save_pretrained(tmp_path)  # as the builder saves it
    written = json.loads((tmp_path / "config.json").read_text())
    packaged = json.loads((GROWN_DIR / "config.json").read_text())
    for data in (written, packaged):
        data.pop("transformers_version")
        data.pop("dtype", None)  # the packaged config records its saved weights' dtype
    assert written == packaged


@pytest.mark.skipif(not (GROWN_DIR / "config.json").is_file(), reason="grown-code-64 is not packaged")
def test_neox_rotary_share_is_the_setting():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(GROWN_DIR)
    for pct, rotary in ((1.0, 64), (0.25, 16)):
        s = GrowSettings(arch="gpt_neox", rotary_pct=pct, layers=1)
        assert read_rope(build_model(s, tokenizer).config).rotary_dim == rotary


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"arch": "gpt2"},
            "arch (--arch) 'gpt2': not a grown-model architecture; use one of llama, qwen2, mistral, gpt_neox",
        ),
        ({"arch": "gpt_neox", "kv_heads": 2}, "kv_heads (--kv-heads) 2: gpt_neox has one key/value head per head"),
        ({"kv_heads": 3}, "kv_heads (--kv-heads) 3: must divide heads (--heads) 4"),
        ({"rotary_pct": 0.25}, "rotary_pct (--rotary-pct) 0.25: only gpt_neox rotates part of each head"),
        ({"arch": "qwen2", "rotary_pct": 0.5}, "use 1.0 for qwen2, or --arch gpt_neox"),
        ({"arch": "gpt_neox", "rotary_pct": 1.5}, "must be in (0, 1]"),
        ({"arch": "gpt_neox", "rotary_pct": 0.01}, "RoPE needs an even number"),
    ],
)
def test_shapes_no_architecture_builds_are_refused(changes, message):
    with pytest.raises(InputError) as info:
        GrowSettings(**changes)
    assert message in str(info.value)


def test_grow_base_refuses_a_bad_shape_before_any_work(tmp_path):
    out = tmp_path / "g"
    cmd = [sys.executable, "-m", "benchmarks.grow_base", "--arch", "gpt_neox", "--kv-heads", "2", "--out", str(out)]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "kv_heads (--kv-heads) 2: gpt_neox" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def _grow(arch: str, few_files, tmp: Path, **shape) -> Path:
    s = GrowSettings(arch=arch, **TINY, **shape)  # type: ignore[arg-type]
    _, report = grow(s, tmp / "base", lambda _: None, split=few_files)
    # The folder's tokenizer, as AutoTokenizer reads it back, is the one the model was trained with: the same
    # number of tokens in the training stream (transformers swaps in Qwen2's own tokenizer class on loading).
    from transformers import AutoTokenizer

    from ctxext.models.grown import encode, encode_files

    trained = report["training"]["train_stream_tokens"]
    loaded = AutoTokenizer.from_pretrained(tmp / "base")
    sep = len(encode(loaded, "\n\n"))  # every document is followed by a blank line in the stream
    assert sum(len(ids) + sep for ids in encode_files(loaded, few_files[1])) == trained
    return tmp / "base"


def _write_recipe(base: Path, tmp: Path, target: int) -> Path:
    recipe = {
        "model": {"path": str(base)},
        "rope": {"method": "yarn", "target_length": target},
        "quantization": {"mode": "nf4"},
        "lora": {"r": 2, "alpha": 4},
        "data": {"path": "builtin:stdlib", "max_documents": 4, "validation_fraction": 0.25, "num_proc": 1},
        "train": {"seq_len": target, "micro_batch_size": 1, "max_steps": 2, "learning_rate": 1e-3, "warmup_steps": 1},
        "output": {"dir": str(tmp / "run")},
    }
    (tmp / "r.yaml").write_text(yaml.safe_dump(recipe))
    return tmp / "r.yaml"


def _extend_train_needle(base: Path, tmp: Path, target: int, *overrides: str) -> dict:
    """``extend`` to ``target``, ``train`` 2 nf4 QLoRA steps there, ``eval needle`` there: the report's model."""
    from transformers import AutoModelForCausalLM

    assert run("extend", str(base), "-m", "yarn", "-t", str(target), "-o", str(tmp / "ext")).exit_code == 0
    check = verify_model_rope(AutoModelForCausalLM.from_pretrained(tmp / "ext", dtype=torch.float32))
    assert check.ok, check
    result = run("train", str(_write_recipe(base, tmp, target)), *overrides)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp / "run" / "run.json").read_text())["status"] == "complete"
    needle = ["--lengths", str(target), "--depths", "0,100", "-o", str(tmp / "n")]
    result = run("eval", "needle", "-m", str(tmp / "run"), *needle)
    assert result.exit_code == 0, result.output
    (model,) = json.loads((tmp / "n" / "report.json").read_text())["models"]
    assert model["model"]["rope_verified"] and model["rope"]["current_length"] == target
    return model


def test_qwen2_gqa_base_with_a_128_token_window(few_files, tmp_path, cache_root):
    base = _grow("qwen2", few_files, tmp_path, heads=4, kv_heads=2, window=128)
    config = json.loads((base / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["max_position_embeddings"] == 128
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    model = _extend_train_needle(base, tmp_path, 512)
    assert model["needle"]["settings"]["lengths"] == [512]
    assert sum(c["trials"] for c in model["needle"]["cells"]) == 10


def test_a_tied_base_saves_one_matrix_that_is_both_embedding_and_head(few_files, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    base = _grow("qwen2", few_files, tmp_path, heads=4, kv_heads=2, window=96, tie_embeddings=True)
    assert json.loads((base / "config.json").read_text())["tie_word_embeddings"] is True
    with safe_open(base / "model.safetensors", "pt") as weights:
        assert not any(k.startswith("lm_head") for k in weights.keys())
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_mistral_gqa_base_keeps_its_tokenizer(few_files, tmp_path, cache_root):
    # Mistral's tokenizer entry honours tokenizer_config.json (Qwen2's does not): the grown tokenizer loads as
    # trained, so the model reads the needle's key with the ids it was trained on (_grow checks the count).
    base = _grow("mistral", few_files, tmp_path, heads=4, kv_heads=2, window=128)
    config = json.loads((base / "config.json").read_text())
    assert config["model_type"] == "mistral" and config["sliding_window"] is None
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    model = _extend_train_needle(base, tmp_path, 256)
    assert model["rope"]["current_length"] == 256


def test_a_continued_stage_can_lengthen_the_window(few_files, tmp_path):
    # A window stage: a model grown at 64 tokens continues at 128 and is saved as a 128-token model.
    first = _grow("mistral", few_files, tmp_path, heads=4, kv_heads=2, window=64)
    lines: list[str] = []
    s = GrowSettings(arch="mistral", **TINY, heads=4, kv_heads=2, window=128)  # type: ignore[arg-type]
    grow(s, tmp_path / "longer", lines.append, init_from=first, split=few_files)
    config = json.loads((tmp_path / "longer" / "config.json").read_text())
    assert config["max_position_embeddings"] == 128 and "window: 64 -> 128 tokens" in "\n".join(lines)


def test_neox_partial_rotary_base(few_files, tmp_path, cache_root):
    # 0.5, not transformers' GPT-NeoX default of 0.25: the setting, not the default, must make the shape.
    base = _grow("gpt_neox", few_files, tmp_path, heads=2, rotary_pct=0.5)
    config = json.loads((base / "config.json").read_text())
    assert config["model_type"] == "gpt_neox" and config["use_parallel_residual"]
    from transformers import AutoConfig

    state = read_rope(AutoConfig.from_pretrained(base))
    assert (state.head_dim, state.rotary_dim) == (16, 8)
    # The recipe defaults (all-linear, embeddings) resolve to NeoX's own module names; Llama's names are refused
    # before loading, with NeoX's names as the fix.
    recipe = str(_write_recipe(base, tmp_path, 256))
    assert run("validate", recipe).exit_code == 0
    llama = ["lora.target_modules=[q_proj,k_proj,v_proj,o_proj]", "lora.extra_trainable=[embed_tokens,norm]"]
    result = run("validate", recipe, "--set", *llama)
    assert result.exit_code == 2
    for fix in NEOX_LORA:
        assert f"for gpt_neox set {fix}" in " ".join(result.output.split())
    # The memory planner models Llama-style layers: it refuses rather than plan NeoX's wrongly.
    result = run("plan", recipe, *NEOX_LORA, "--cpu")
    assert result.exit_code == 2 and "this gpt_neox config has a fused query_key_value" in result.output
    model = _extend_train_needle(base, tmp_path, 256)  # the defaults, unchanged
    assert model["rope"]["rotary_dim"] == 8 and model["rope"]["parameters"]["partial_rotary_factor"] == 0.5
    assert sum(c["trials"] for c in model["needle"]["cells"]) == 10


# The packaged bases of other shapes (issue: a recipe proven on bases it was not tuned on): name, window, the
# config keys that make the shape, and the in-window retrieval measured over 250 trials at depths 0-100
# (experiments/results/log/, sessions 4 and 5).
PACKAGED_SHAPES = [
    ("grown-neox-64", 64, {"model_type": "gpt_neox", "partial_rotary_factor": 0.25}),  # 90 %
    ("grown-mistral-128", 128, {"model_type": "mistral", "num_key_value_heads": 2, "sliding_window": None}),  # 98 %
]


@pytest.mark.parametrize(("name", "window", "shape"), PACKAGED_SHAPES, ids=[n for n, _, _ in PACKAGED_SHAPES])
def test_packaged_base_of_another_shape_retrieves_inside_its_window(name, window, shape, cache_root):
    # Read back with the tokenizer it was trained with, it retrieves a key in its window.
    if not (RESOURCES / name / "model.safetensors").is_file():
        pytest.skip(f"{name} is not packaged")
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(resolve_model_path(f"builtin:{name}"))
    assert config.max_position_embeddings == window
    for key, value in shape.items():
        assert (config.rope_parameters.get(key) if key == "partial_rotary_factor" else getattr(config, key)) == value
    # The registry's needle task in the code form it was pretrained on (template 0), teacher-forced, seeded.
    from ctxext.evaluation.sections.grids.engine import GridSettings, evaluate_task_grid
    from ctxext.models.load import ModelSpec, load_model
    from ctxext.scoring.texts import iter_texts
    from ctxext.tasks import Haystack

    lm = load_model(ModelSpec(f"builtin:{name}"), device="cpu")
    hay = Haystack.from_texts(lm.tokenizer, iter_texts("builtin:stdlib-heldout"), 50_000, "builtin:stdlib-heldout")
    grid = GridSettings(lengths=[window], depths=[25, 75], trials=20, seed=1234)
    result = evaluate_task_grid(lm, grid, "needle", hay, template=0, show_progress=False)
    assert result["by_length"][str(window)]["accuracy"] >= 0.75, result["by_length"]
