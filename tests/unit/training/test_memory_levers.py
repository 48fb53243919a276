"""train.memory: the memory levers — exact tiling, the bf16 residual stream, refusals, the record, the plan.

CPU tests check what the CPU can: the tiled MLP and the tiled (chunked) loss against the plain model, the bf16
residual stream on a 4-bit base, every refusal, ``run.json``, the planner. The GPU-marked tests run each GPU-only
path (``scripts/gpu-check.sh`` runs them with measured peaks).
"""

from __future__ import annotations

import copy
import json
import subprocess

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.errors import InputError
from ctxext.recipe.memory import Levers, MemorySection, resolve_levers
from ctxext.training.levers import cast_residual_stream, tile_mlps
from ctxext.training.losses import chunked_cross_entropy
from tests.helpers import ROOT
from tests.helpers.train import write_recipe

runner = CliRunner()
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).float().train()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


@pytest.mark.parametrize("shards", [0, 3])
def test_tiled_mlp_and_loss_equal_the_plain_model(shards):
    """fp32: tiled MLP + chunked loss vs transformers' own forward and loss — same loss and gradients (1e-5)."""
    from peft import LoraConfig, get_peft_model

    plain = _tiny_llama()
    plain.activation_checkpointing_enable()
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"])
    plain = get_peft_model(plain, lora)
    tiled = copy.deepcopy(plain)
    assert tile_mlps(tiled, shards) == 2
    for p in list(plain.parameters()) + list(tiled.parameters()):
        p.requires_grad_(True)  # the base weights too: every gradient is compared
    ids = torch.randint(0, 512, (2, 300), generator=torch.Generator().manual_seed(1))
    reference = plain(input_ids=ids, labels=ids).loss
    reference.backward()
    base = tiled.get_base_model()
    hidden = base.model(input_ids=ids).last_hidden_state
    loss = chunked_cross_entropy(hidden[:, :-1], base.lm_head.weight, ids[:, 1:], chunk_size=64)
    loss.backward()
    assert abs(loss.item() - reference.item()) <= 1e-5 * abs(reference.item())
    pairs = list(zip(plain.named_parameters(), tiled.named_parameters(), strict=True))
    worst = max(_relative(b.grad, a.grad) for (_, a), (_, b) in pairs)
    assert worst < 1e-5, worst


def test_tiled_mlp_saves_less_than_the_plain_mlp():
    """What autograd keeps for one MLP call: a shard's intermediates, not the whole sequence's."""
    mlp = _tiny_llama().model.layers[0].mlp
    x = torch.randn(1, 1024, 64, requires_grad=True)
    saved: list[int] = []

    def count(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        mlp(x)
    plain = sum(saved)
    tile_mlps(_holder(mlp), 8)
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        mlp(x)
    assert sum(saved) < plain / 3


def _holder(mlp: torch.nn.Module) -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.mlp = mlp
    layer.config = LlamaConfig(hidden_size=64)  # type: ignore[assignment]
    return layer


def test_tiled_mlp_refuses_a_mlp_that_is_not_gated():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64))
    with pytest.raises(InputError, match=r"train\.memory\.tiled_mlp: tiles the gated MLP.*tiled_mlp=false"):
        tile_mlps(model, 0)


def test_bf16_residual_stream_on_a_4bit_base(tmp_path):
    """nf4 base, bf16 compute: the stream between layers is bf16, the trained embeddings and norms stay fp32."""
    from ctxext.recipe.sections import LoraSection
    from ctxext.training.model import add_lora, load_base

    model, _, _ = load_base("builtin:tiny-llama", quantization="nf4", compute_dtype=torch.bfloat16)
    levers = Levers(residual_dtype="bf16")
    peft_model, _ = add_lora(model, LoraSection(r=4), True, True, levers)
    seen: list[torch.dtype] = []
    for layer in peft_model.get_base_model().model.layers:
        layer.register_forward_pre_hook(lambda m, args, kwargs: seen.append(args[0].dtype), with_kwargs=True)
    peft_model.train()
    ids = torch.randint(0, 100, (1, 64))
    base = peft_model.get_base_model()
    hidden = base.model(input_ids=ids).last_hidden_state
    assert hidden.dtype == torch.bfloat16
    loss = chunked_cross_entropy(hidden[:, :-1], base.lm_head.weight, ids[:, 1:])
    loss.backward()
    assert seen and set(seen) == {torch.bfloat16}
    trained = {n: p for n, p in peft_model.named_parameters() if p.requires_grad and "modules_to_save" in n}
    assert trained and all(p.dtype == torch.float32 and p.grad is not None for p in trained.values())
    # Without the lever, peft's upcast makes the stream fp32 (what the planner assumes for residual_dtype=fp32).
    fp32 = _tiny_llama()
    names = cast_residual_stream(fp32, torch.float32)
    assert "model.embed_tokens" in names and "model.norm" in names


@pytest.mark.parametrize(
    ("residual", "dropout"),
    [("bf16", 0.0), ("fp32", 0.05)],
    ids=["bf16 stream: fp32 LoRA input copies", "fp32 stream, LoRA dropout 0.05: dropped copies + masks"],
)
def test_planned_layer_bytes_match_autograd(tiny_model_dir, residual, dropout):
    """What autograd saves per layer on a 4-bit base against the planner's formula, for what the levers change:
    a bf16 stream (peft's fp32 copy of each adapted projection's input: half of the bytes, measured) and LoRA
    dropout (a dropped copy and a mask per projection: +57 % measured, +50 % planned). The fp32 case without
    dropout is tests/unit/planner/test_plan.py's."""
    from ctxext.planner.footprint import ModelShape, Setup, layer_bytes
    from ctxext.recipe.sections import LoraSection
    from ctxext.training.model import add_lora, load_base
    from ctxext.training.steps import CausalLMWithChunkedLoss

    length = 512
    dtype = torch.bfloat16 if residual == "bf16" else torch.float32
    model, _, _ = load_base(str(tiny_model_dir), quantization="nf4", compute_dtype=dtype)
    lora = LoraSection(r=8, dropout=dropout, extra_trainable=[])
    peft_model, _ = add_lora(model, lora, False, True, Levers(residual_dtype=residual))
    wrapper = CausalLMWithChunkedLoss(peft_model, 1024).train()
    params = {p.untyped_storage().data_ptr() for p in wrapper.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(3, 500, (1, length), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        wrapper(ids, torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1))
    shape = ModelShape.from_config(peft_model.get_base_model().config)
    setup = Setup(
        seq_len=length,
        compute_bytes=dtype.itemsize,
        residual_bytes=dtype.itemsize,
        lora_r=8,
        lora_dropout=dropout,
        extra_trainable=(),
        checkpointing=False,
    )
    predicted = shape.layers * layer_bytes(shape, setup)
    assert 0.75 < predicted / sum(saved.values()) < 1.25, (predicted, sum(saved.values()))


def test_resolution_auto_on_a_gpu_and_on_the_cpu():
    auto = MemorySection()
    cpu = resolve_levers(auto, device_type="cpu", compute_dtype="float32", quantized=True, checkpointing=True)
    assert cpu == Levers("fp32", False, None, False)
    gpu = resolve_levers(auto, device_type="cuda", compute_dtype="bfloat16", quantized=True, checkpointing=True)
    assert gpu == Levers("bf16", True, 0, True)
    no_ckpt = resolve_levers(auto, device_type="cuda", compute_dtype="bfloat16", quantized=True, checkpointing=False)
    assert not no_ckpt.offload_checkpoints
    # A bf16 run on the CPU (quantization.compute_dtype: bfloat16) gets the bf16 stream; nothing CUDA-only.
    cpu_bf16 = resolve_levers(auto, device_type="cpu", compute_dtype="bfloat16", quantized=True, checkpointing=True)
    assert cpu_bf16 == Levers("bf16", False, None, False)


@pytest.mark.parametrize(
    ("memory", "device", "dtype", "message"),
    [
        ({"offload_checkpoints": True}, "cpu", "float32", "train.memory.offload_checkpoints: offloading"),
        ({"residual_dtype": "bf16"}, "cpu", "float32", "train.memory.residual_dtype: bf16 needs a bf16 run"),
        ({"residual_dtype": "bf16"}, "cuda", "float16", "this run computes in float16"),
    ],
)
def test_levers_that_cannot_run_are_refused(memory, device, dtype, message):
    with pytest.raises(InputError, match=message):
        resolve_levers(
            MemorySection(**memory), device_type=device, compute_dtype=dtype, quantized=True, checkpointing=True
        )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.memory.offload_checkpoints=true", "train.memory.offload_checkpoints: offloading checkpoints needs"),
        ("train.memory.residual_dtype=bf16", "train.memory.residual_dtype: bf16 needs a bf16 run"),
        ("train.memory.tiled_mlp=1", "train.memory.tiled_mlp"),
        ("train.memory.tiled=true", "train.memory.tiled"),
    ],
)
def test_cli_train_refuses_with_exit_2_and_writes_nothing(tmp_path, override, message):
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run")
    result = runner.invoke(app, ["train", str(recipe), override], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


def test_run_json_records_the_levers(tmp_path, cache_root):
    from ctxext.recipe.schema import load_recipe
    from ctxext.training.run import train

    path = write_recipe(tmp_path / "r.yaml", tmp_path / "run", train={"max_steps": 1, "memory": {"tiled_mlp": 2}})
    result = train(load_recipe(path))
    record = json.loads((result.run_dir / "run.json").read_text())["memory"]
    assert record == {
        "residual_dtype": "fp32",
        "offload_checkpoints": False,
        "tiled_mlp": 2,
        "expandable_segments": False,
    }


def _plan(*overrides: str):
    from ctxext.models.devices import gpu
    from ctxext.planner.plan import plan_recipe
    from ctxext.recipe.schema import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "llama3-8b-yarn-64k.yaml", list(overrides))
    return plan_recipe(recipe, gpu("h100-80gb"), advise_changes=False)


def test_plan_with_the_levers_reaches_256k_on_one_h100_and_ranks_them():
    plan = _plan()
    assert plan.longest is not None and plan.longest >= 256 * 1024
    names = [e.name for e in plan.levers]
    for lever in ("bf16 residual stream", "checkpoint offload", "tiled MLP", "expandable segments", "tiled logits"):
        assert any(n.startswith(lever) for n in names), names
    assert all(e.on and e.buys > 0 for e in plan.levers)
    assert [e.buys for e in plan.levers] == sorted((e.buys for e in plan.levers), reverse=True)
    assert any("pinned host memory" in n for n in plan.memory.notes)
    off = _plan(
        "train.memory.offload_checkpoints=false",
        "train.memory.tiled_mlp=false",
        "train.memory.residual_dtype=fp32",
        "train.memory.expandable_segments=false",
    )
    assert off.longest is not None and off.longest < 64 * 1024 < plan.longest


def test_plan_counts_the_document_mask_and_lora_dropout():
    plain = _plan().memory
    masked = _plan("data.document_mask=true").memory
    mask = next(c for c in masked.components if c.name.startswith("T×T attention mask"))
    # 64k tokens: a bool 65,536² mask for the model, and in the recomputed layer SDPA's bf16 additive copy (with
    # k and v repeated to every query head: transformers does not pass enable_gqa with a mask).
    assert mask.bytes == 65536**2
    layer = next(c for c in plain.components if c.name == "recomputed layer").bytes
    masked_layer = next(c for c in masked.components if c.name == "recomputed layer").bytes
    assert masked_layer - layer == 65536**2 * 2 + 2 * 65536 * (4096 - 1024) * 2
    assert masked.total > plain.total
    dropped = _plan("lora.dropout=0.05").memory
    layer = next(c for c in plain.components if c.name == "recomputed layer").bytes
    assert next(c for c in dropped.components if c.name == "recomputed layer").bytes > layer


def test_gpu_check_without_cuda_says_so_and_exits_2():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the real check")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() + done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0], lines


def test_gpu_check_step_runs_on_the_cpu_with_a_tiny_shape(tmp_path):
    """The prepared GPU script's own code (build, save, load through ctxext, one step, plan) on a tiny shape."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_check import OFF, run_path

    tiny = {"hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 4, "num_key_value_heads": 2}
    result = run_path(
        layers=1, seq_len=256, memory={**OFF, "tiled_mlp": 2}, device_type="cpu", shape={**tiny, "vocab_size": 2048}
    )
    assert result["levers"]["tiled_mlp"] == 2 and result["planned"] > 0 and result["measured"] > 0
    assert result["tokens_per_s"] > 0


# ------------------------------------------------------------------------------------------------
# GPU-only paths (scripts/gpu-check.sh runs the same paths with measured peaks against the plan)
# ------------------------------------------------------------------------------------------------


def _gpu_step(**memory):
    """One QLoRA training step of a small random Llama-3-shaped model on CUDA with the given levers."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_check import run_path

    return run_path(layers=2, seq_len=16384, memory=memory)


OFF = {"residual_dtype": "fp32", "offload_checkpoints": False, "tiled_mlp": False, "expandable_segments": False}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("lever", [{"residual_dtype": "bf16"}, {"offload_checkpoints": True}, {"tiled_mlp": True}])
def test_each_gpu_lever_moves_the_measured_peak_as_planned(lever):
    """Each lever lowers the measured peak as the plan says; both within 0.5–1.25× of the plan.

    The bounds are loose: no GPU has checked the plan's CUDA terms (context, fragmentation) yet.
    """
    base = _gpu_step(**OFF)
    with_lever = _gpu_step(**{**OFF, **lever})
    assert with_lever["planned"] < base["planned"]
    assert with_lever["measured"] < base["measured"], (lever, base, with_lever)
    for result in (base, with_lever):
        assert 0.5 <= result["measured"] / result["planned"] <= 1.25, (lever, result)


@pytest.mark.gpu
@needs_cuda
def test_all_gpu_levers_together_fit_the_plan():
    result = _gpu_step()
    assert result["levers"] == {
        "residual_dtype": "bf16",
        "offload_checkpoints": True,
        "tiled_mlp": 0,
        "expandable_segments": True,
    }
    assert 0.5 <= result["measured"] / result["planned"] <= 1.25, result
