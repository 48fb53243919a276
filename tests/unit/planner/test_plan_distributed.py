"""`ctxext plan` past one GPU: full fine-tuning, key/value heads replicated under a wide split, 8×H100 plans.

Config-only: no weights are loaded, nothing is trained.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.models.devices import gpu
from ctxext.planner.footprint import ModelShape, Setup, footprint
from ctxext.planner.layer import flash_backward_buffers, kv_heads_per_rank, replicated_kv
from ctxext.planner.plan import plan_recipe, read_model_config
from ctxext.recipe.schema import load_recipe

runner = CliRunner()
LLAMA3 = "recipes/llama3-8b-yarn-64k.yaml"
TINY = ModelShape(vocab=512, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, tied=False)
ONE_MILLION = 1_048_576
ALST_ONE_NODE = 3_700_000


def _component(fp, name: str) -> int:
    return next(c.bytes for c in fp.components if c.name == name)


def test_full_fine_tune_state_is_sharded_by_the_engine():
    n = TINY.params()
    assert n == TINY.linear_params() + 2 * 512 * 64 + 5 * 64  # projections, embeddings, head, norms
    full = dict(seq_len=1024, quantization="none", finetune="full", world=8, optimizer="adamw")
    fsdp = footprint(TINY, Setup(**full, sharding="fsdp2"))
    # FSDP2 shards the fp32 parameters (the master weights), fp32 gradients and the two AdamW moments.
    assert _component(fsdp, "weights (fp32 master)") == int(n * 4 / 8)
    assert _component(fsdp, "gradients") == int(n * 4 / 8)
    assert _component(fsdp, "optimizer moments") == int(n * 8 / 8)
    zero3 = footprint(TINY, Setup(**full, sharding="zero3"))
    # ZeRO-3: bf16 weight and gradient partitions, the fp32 master partition in the optimizer.
    assert _component(zero3, "bf16 weights") == int(n * 2 / 8)
    assert _component(zero3, "fp32 master weights") == int(n * 4 / 8)
    assert _component(zero3, "gradients") == int(n * 2 / 8)
    moved = footprint(TINY, Setup(**full, sharding="zero3", offload_optimizer=True))
    names = {c.name for c in moved.components}
    assert "optimizer moments" not in names and "fp32 master weights" not in names and "bf16 weights" in names
    assert any("optimizer offload" in note for note in moved.notes)
    # No LoRA: no adapter terms, and every projection keeps its input (measured: tests/unit/planner/test_plan_layer.py).
    assert "LoRA params" not in {c.name for c in fsdp.components}


def test_kv_heads_each_rank_holds_under_a_split():
    llama = ModelShape(vocab=1, hidden=4096, layers=1, heads=32, kv_heads=8, head_dim=128, intermediate=1, tied=False)
    assert [kv_heads_per_rank(llama, sp) for sp in (1, 2, 4, 8, 16, 32)] == [8, 4, 2, 1, 1, 1]
    assert replicated_kv(llama, Setup(seq_len=1, sequence_parallel=8)) == 0
    assert replicated_kv(llama, Setup(seq_len=1, sequence_parallel=32)) == 24  # 32 ranks hold 1 head each
    one_kv = dataclasses.replace(TINY, heads=4, kv_heads=1)
    assert kv_heads_per_rank(one_kv, 2) == 1 and replicated_kv(one_kv, Setup(seq_len=1, sequence_parallel=2)) == 1
    # SmolLM2's shape: 9 query heads over 3 key/value heads; 3 ranks of 3 query heads need one group each.
    smol = dataclasses.replace(TINY, heads=9, kv_heads=3)
    assert kv_heads_per_rank(smol, 3) == 1 and kv_heads_per_rank(smol, 9) == 1


def test_replicated_heads_are_counted_and_the_plan_says_whether_they_pay():
    split = Setup(seq_len=4096, world=4, sequence_parallel=4, optimizer="adamw", loss_chunk=256)
    one_kv = dataclasses.replace(TINY, kv_heads=1)
    with_replicas = footprint(one_kv, split)
    # Each of the 4 ranks holds the one key/value head whole (the gathered sequence): k and v are 4 ranks × 1 head
    # per local token, not 1 head / 4.
    k = next(c for c in with_replicas.components if c.name == "recomputed layer").bytes
    no_replicas = footprint(TINY, dataclasses.replace(split, sequence_parallel=2, world=2))
    assert k > 0 and no_replicas.total > with_replicas.total  # the wider split still lowers the peak
    h100 = gpu("h100-80gb")
    # 16 GPUs over Llama-3-8B's 8 key/value heads: sp 8 fits 64k tokens, so sp 16's replicas do not pay.
    plan = plan_recipe(load_recipe(LLAMA3, ["train.sequence_parallel_size=16"]), h100, num_gpus=16, search=False)
    notes = " ".join(plan.notes)
    assert "each rank holds 1 key/value head(s) for its 2 query heads" in notes
    assert "replication costs more than it saves here: sp 8 (no replication) fits 65,536 tokens" in notes
    # At 3M tokens sp 8 does not fit and sp 16 does: replication pays.
    long = ["train.seq_len=3145728", "rope.target_length=3145728", "train.sequence_parallel_size=16"]
    plan = plan_recipe(load_recipe(LLAMA3, long), h100, num_gpus=16, search=False)
    assert "replication pays: sp 8 (no replication) needs" in " ".join(plan.notes), plan.notes


def test_flash_backward_buffers_follow_the_kernel_source():
    s = Setup(seq_len=1000, compute_bytes=2, residual_bytes=2)
    buffers = dict(flash_backward_buffers(TINY, s))
    # dq_accum: fp32, sequence rounded up to 128, head_dim up to 32; GQA: dK and dV expanded to the 4 query heads.
    assert buffers["fp32 dQ accumulator"] == 4 * 1024 * 4 * 32
    assert buffers["fp32 softmax_d"] == 4 * 1024 * 4
    assert buffers["dK, dV expanded to every query head"] == 2 * 2 * 1000 * 4 * 16
    mha = dict(flash_backward_buffers(dataclasses.replace(TINY, kv_heads=4), s))
    assert "dK, dV expanded to every query head" not in mha


@pytest.mark.parametrize("model", ["meta-llama/Meta-Llama-3-8B", "Qwen/Qwen3-8B"])
def test_eight_h100s_plan_a_million_tokens_full_fine_tune_with_the_band(model):
    args = ["plan", LLAMA3, f"model.path={model}", "--gpu", "h100-80gb", "--num-gpus", "8", "--sp", "8"]
    full = json.loads(runner.invoke(app, [*args, "--mode", "full", "--json"]).output)
    assert full["mode"] == "full" and full["setup"]["sharding"] == "fsdp2" and full["setup"]["world"] == 8
    assert full["longest_seq_len"] >= ONE_MILLION
    low, high = full["band_gib"]
    assert low <= full["total_gib"] <= high and high <= full["usable_gib"]
    bases = {c["name"]: c["basis"] for c in full["components"]}
    assert bases["recomputed layer"] == "measured" and bases["flash-attention backward buffers"] == "modelled"
    assert bases["optimizer moments"] == "counted"
    # At 1M tokens: the plan fits 80 GB per GPU with its band.
    million = ["train.seq_len=1048576", "rope.target_length=1048576"]
    at = json.loads(runner.invoke(app, [*args, *million, "--mode", "full", "--json"]).output)
    assert at["fits"] and at["band_gib"][1] <= at["usable_gib"]


def test_qlora_on_one_node_falls_short_of_alst_and_says_which_terms():
    length = ["train.seq_len=3702784", "rope.target_length=3702784"]
    plan = plan_recipe(load_recipe(LLAMA3, length), gpu("h100-80gb"), num_gpus=8, sharding="fsdp2", search=True)
    assert plan.setup.sequence_parallel == 1  # the recipe's own split: none
    split = plan_recipe(
        load_recipe(LLAMA3, [*length, "train.sequence_parallel_size=8"]), gpu("h100-80gb"), num_gpus=8, sharding="fsdp2"
    )
    assert not split.fits and split.longest < ALST_ONE_NODE
    # The reason, term by term: the recomputed layer's saved tensors are the largest term of the peak.
    peak = split.memory.peak_phase
    terms = sorted((c for c in split.memory.components if peak in c.phases), key=lambda c: -c.bytes)
    assert terms[0].name.startswith("recomputed layer") and terms[0].bytes > 0.4 * split.memory.total


def test_qwen3_config_is_bundled_with_its_q_k_norms():
    config, source = read_model_config("Qwen/Qwen3-8B")
    shape = ModelShape.from_config(config)
    assert "bundled" in source and shape.qk_norm and shape.model_type == "qwen3"
    assert (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.head_dim) == (4096, 36, 32, 8, 128)
    assert (shape.intermediate, shape.vocab, shape.tied) == (12288, 151936, False)
    assert config.rope_parameters["rope_theta"] == 1_000_000
    assert 8.1e9 < shape.params() < 8.3e9  # 8.2B published


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "bogus"], "--mode: unknown 'bogus'; choose one of: qlora, lora, full"),
        (["--offload-optimizer"], "--offload-optimizer: plans a full fine-tune's optimizer states"),
        (["--sp", "40"], "train.sequence_parallel_size: 40 exceeds the model's 32 attention heads"),
    ],
)
def test_bad_plan_flags_exit_2_naming_the_flag(args, message):
    result = runner.invoke(app, ["plan", LLAMA3, "--gpu", "h100-80gb", *args], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()) and "Traceback" not in result.output


def test_mode_defaults_to_what_the_recipe_trains():
    qlora = plan_recipe(load_recipe(LLAMA3), gpu("h100-80gb"), search=False, advise_changes=False)
    lora = plan_recipe(load_recipe(LLAMA3, ["quantization.mode=none"]), gpu("h100-80gb"), search=False)
    assert qlora.mode == "qlora" and lora.mode == "lora" and lora.setup.quantization == "none"
    full = plan_recipe(load_recipe(LLAMA3), gpu("h100-80gb"), search=False, advise_changes=False, mode="full")
    assert full.setup.quantization == "none" and full.setup.optimizer == "adamw" and full.setup.lora_targets == ()
    # The recipe's own train.mode, without --mode: `ctxext plan recipe.yaml train.mode=full`.
    full_recipe = load_recipe(LLAMA3, ["train.mode=full", "quantization.mode=none"])
    assert plan_recipe(full_recipe, gpu("h100-80gb"), search=False, advise_changes=False).setup == full.setup
    args = ["plan", LLAMA3, "train.mode=full", "quantization.mode=none", "--gpu", "h100-80gb", "--json"]
    planned = json.loads(runner.invoke(app, args).output)
    assert planned["mode"] == "full" and planned["setup"]["quantization"] == "none"


def test_a_full_fine_tune_that_does_not_fit_gets_sharding_and_splits_not_a_4_bit_base():
    plan = plan_recipe(load_recipe(LLAMA3), gpu("h100-80gb"), num_gpus=8, sharding="none", mode="full")
    assert not plan.fits
    summaries = " | ".join(a.summary for a in plan.advice)
    assert "4-bit" not in summaries and "shard weights, gradients and optimizer over the 8 GPUs" in summaries
