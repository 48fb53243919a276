"""Three key/value heads (SmolLM2's 9 query / 3 key-value heads) through every step that reads the head counts.

A tiny model of that shape (hidden 72 = 9 heads × 8, 3 key/value heads): the temperature fold, the planner and
its sequence-split advice, the memory levers, the sequence split's refusal of a size the heads cannot take,
and export.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.errors import InputError
from tests.helpers.evaluation import GQA, save_tiny_model
from tests.helpers.tiny import tiny_model

runner = CliRunner()


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def gqa_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A saved 9 / 3-head Llama (context 256) with a tokenizer."""
    return save_tiny_model(tiny_tokenizer, tmp_path_factory.mktemp("gqa"), tie_word_embeddings=True, **GQA)


def test_the_temperature_fold_equals_the_run_time_temperature_on_grouped_heads():
    from ctxext.models.embeddings import embeddings_tied
    from ctxext.models.temperature import fold_attention_temperature, set_attention_temperature

    hot = tiny_model("llama", tie_word_embeddings=True, **GQA)
    folded = copy.deepcopy(hot)
    ids = torch.randint(0, 512, (1, 80), generator=torch.Generator().manual_seed(0))
    assert set_attention_temperature(hot, 1.2) == 2
    fold_attention_temperature(folded, 1.2)
    with torch.no_grad():
        torch.testing.assert_close(folded(ids).logits, hot(ids).logits, rtol=1e-5, atol=1e-5)
    assert embeddings_tied(folded)  # the fold touches the query projections only


def test_the_sequence_split_serves_two_and_refuses_more_processes_than_query_heads(gqa_dir, tmp_path):
    from ctxext.models.sources import config_from_folder
    from ctxext.training.sequence_parallel import check_heads
    from tests.helpers.train import write_recipe

    config = config_from_folder(gqa_dir)
    assert check_heads(config, 3).engine == "deepspeed"  # 3 query heads and 1 key/value head per process
    assert check_heads(config, 2).engine == "ctxext"  # key/value head 1 replicated on both processes
    with pytest.raises(InputError, match=r"10 .*9"):
        check_heads(config, 10)
    # ctxext validate (and train, before a weight is loaded) says the same.
    recipe = write_recipe(
        tmp_path / "r.yaml",
        tmp_path / "out",
        model={"path": str(gqa_dir)},
        rope={"method": "yarn", "target_length": 1024},
        train={"seq_len": 1024, "max_steps": 1, "sequence_parallel_size": 10},
    )
    result = runner.invoke(app, ["validate", str(recipe)])
    text = flat(result.output)
    assert result.exit_code == 2 and "train.sequence_parallel_size" in text and "9" in text
    assert not (tmp_path / "out").exists()


def test_plan_reads_grouped_heads_and_offers_only_splits_they_divide(gqa_dir):
    args = ["plan", "recipes/tiny-cpu.yaml", f"model.path={gqa_dir}", "--gpu", "h100-80gb", "--json"]
    plan = json.loads(runner.invoke(app, args).output)
    assert plan["fits"] and plan["model"] == str(gqa_dir)
    text = flat(runner.invoke(app, args[:-1]).output)
    assert "(2 layers, hidden 72, vocab 512)" in text
    # Asked for more processes than query heads: refused with training's message; 2 (replicated) and 3 are planned.
    bad = runner.invoke(app, [*args, "--sp", "10"], env={"COLUMNS": "300"})
    assert bad.exit_code == 2 and "exceeds the model's 9 attention heads" in flat(bad.output)
    two = json.loads(runner.invoke(app, [*args, "--sp", "2"]).output)
    assert two["setup"]["sequence_parallel"] == 2
    split = json.loads(runner.invoke(app, [*args, "--sp", "3"]).output)
    assert split["setup"]["sequence_parallel"] == 3


def test_the_memory_levers_give_the_plain_loss_and_gradients_on_grouped_heads():
    from peft import LoraConfig, get_peft_model

    from ctxext.training.levers import tile_mlps
    from ctxext.training.losses import chunked_cross_entropy

    plain = tiny_model("llama", **GQA).train()
    plain.activation_checkpointing_enable()
    plain = get_peft_model(plain, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"]))
    tiled = copy.deepcopy(plain)
    assert tile_mlps(tiled, 3) == 2
    ids = torch.randint(0, 512, (2, 200), generator=torch.Generator().manual_seed(1))
    reference = plain(input_ids=ids, labels=ids).loss
    reference.backward()
    base = tiled.get_base_model()
    loss = chunked_cross_entropy(base.model(input_ids=ids).last_hidden_state[:, :-1], base.lm_head.weight, ids[:, 1:])
    loss.backward()
    assert abs(loss.item() - reference.item()) <= 1e-5 * abs(reference.item())
    pairs = zip(plain.parameters(), tiled.parameters(), strict=True)
    grads = [(a.grad, b.grad) for a, b in pairs if a.grad is not None]
    assert grads and all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in grads)


def test_export_of_an_extended_grouped_head_model(gqa_dir, tmp_path):
    out = tmp_path / "ext"
    done = runner.invoke(app, ["extend", str(gqa_dir), "-m", "yarn", "-t", "1024", "--out", str(out)])
    assert done.exit_code == 0, done.output
    result = runner.invoke(app, ["export", str(out), "--for", "vllm", "--for", "lm-eval"])
    assert result.exit_code == 0, result.output
    text = flat(result.output)
    assert "vllm serve" in text and "--max-model-len 1024" in text and "Problem" not in text
