"""The planner's per-layer activation terms against what autograd saves, measured with saved-tensor hooks.

Each case builds one small model through ctxext's training path (``load_weights`` + ``add_lora`` with the memory
levers, or every weight trained for a full fine-tune), runs one forward pass with
``torch.autograd.graph.saved_tensors_hooks`` and sums the distinct storages packed inside decoder layer 1 (not
layer 0, which also packs what every layer shares: the rotary cos/sin) — the parameters and the layer's input (its
checkpoint) left out. The planner's :func:`ctxext.planner.layer.layer_saved` must give the same bytes.
"""

from __future__ import annotations

import pytest
import torch

from ctxext.planner.footprint import ModelShape, Setup, layer_bytes
from ctxext.planner.layer import layer_saved
from tests.helpers import ROOT

TOKENS = 96
SHAPES = {
    # hidden, intermediate, heads, kv heads, head_dim (None: hidden / heads)
    "llama-gqa": dict(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2),
    "llama-mha": dict(hidden_size=48, intermediate_size=112, num_attention_heads=3, num_key_value_heads=3),
    "qwen3": dict(hidden_size=64, intermediate_size=144, num_attention_heads=4, num_key_value_heads=2, head_dim=24),
}


def _folder(tmp_path_factory, name: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    out = tmp_path_factory.mktemp(name)
    kind = "qwen3" if name.startswith("qwen3") else "llama"
    config = AutoConfig.for_model(kind, vocab_size=256, num_hidden_layers=3, tie_word_embeddings=False, **SHAPES[name])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {name: _folder(tmp_path_factory, name) for name in SHAPES}


def _measure(model: torch.nn.Module, attention_mask: torch.Tensor | None = None) -> int:
    """Bytes of the distinct storages decoder layer 1 saves in one forward pass (parameters and input excluded)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.model  # the decoder stack: the head and the loss are not per layer
    layers = decoder.layers
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    excluded, inside, seen = set(params), [False], {}

    def enter(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        excluded.add(hidden.untyped_storage().data_ptr())
        inside[0] = True

    def leave(module, args, output):
        inside[0] = False

    layers[1].register_forward_pre_hook(enter, with_kwargs=True)
    layers[1].register_forward_hook(leave)
    shared: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if not inside[0]:
            shared.add(ptr)  # packed outside layer 1 first (layer 0: cos/sin, shared by every layer)
        elif ptr not in excluded and ptr not in shared:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(3, 250, (1, TOKENS), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        decoder(input_ids=ids, attention_mask=attention_mask)
    return sum(seen.values())


def _lora_model(folder, quantization: str, dtype: torch.dtype, residual: str, lora: dict, attn: str = "sdpa"):
    from ctxext.models.build import load_weights
    from ctxext.models.sources import config_from_folder
    from ctxext.recipe.memory import Levers
    from ctxext.recipe.sections import LoraSection
    from ctxext.training.model import add_lora

    model = load_weights(
        folder, config_from_folder(folder), quantization=quantization, compute_dtype=dtype, attn_implementation=attn
    )
    peft_model, _ = add_lora(model, LoraSection(**lora), False, quantization != "none", Levers(residual_dtype=residual))
    return peft_model.train()


def _full_model(folder, dtype: torch.dtype, attn: str = "sdpa"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn).train()
    for p in model.parameters():
        p.requires_grad_(True)
    return model


# (case id, shape, fine-tune, quantization, compute dtype, residual dtype, LoRA settings, attention)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CASES = [
    ("qlora fp32 (CPU default), norms trained", "llama-gqa", "lora", "nf4", "fp32", "fp32", {"r": 8}, "sdpa"),
    ("qlora bf16 stream, norms trained", "llama-gqa", "lora", "nf4", "bf16", "bf16", {"r": 8}, "sdpa"),
    ("qlora bf16 compute, peft fp32 stream", "llama-gqa", "lora", "nf4", "bf16", "fp32", {"r": 8}, "sdpa"),
    (
        "qlora bf16 stream, frozen norms",
        "llama-mha",
        "lora",
        "nf4",
        "bf16",
        "bf16",
        {"r": 4, "extra_trainable": []},
        "sdpa",
    ),
    ("qlora fp32, dropout", "llama-gqa", "lora", "nf4", "fp32", "fp32", {"r": 8, "dropout": 0.05}, "sdpa"),
    ("qlora bf16 stream, dropout", "llama-gqa", "lora", "nf4", "bf16", "bf16", {"r": 8, "dropout": 0.1}, "sdpa"),
    (
        "qlora fp32, q/v adapters only",
        "llama-mha",
        "lora",
        "nf4",
        "fp32",
        "fp32",
        {"r": 8, "target_modules": ["q_proj", "v_proj"], "extra_trainable": []},
        "sdpa",
    ),
    ("lora on a bf16 base", "llama-gqa", "lora", "none", "bf16", "bf16", {"r": 8}, "sdpa"),
    ("qlora fp32, eager attention", "llama-gqa", "lora", "nf4", "fp32", "fp32", {"r": 8}, "eager"),
    ("qwen3 qlora bf16 stream", "qwen3", "lora", "nf4", "bf16", "bf16", {"r": 8}, "sdpa"),
    ("qwen3 qlora fp32", "qwen3", "lora", "nf4", "fp32", "fp32", {"r": 8, "extra_trainable": []}, "sdpa"),
    ("qlora fp32, document mask (4D)", "llama-gqa", "lora", "nf4", "fp32", "fp32", {"r": 8, "mask": True}, "sdpa"),
    ("full fine-tune bf16", "llama-gqa", "full", "none", "bf16", "bf16", {}, "sdpa"),
    ("full fine-tune fp32", "llama-mha", "full", "none", "fp32", "fp32", {}, "sdpa"),
    ("qwen3 full fine-tune bf16", "qwen3", "full", "none", "bf16", "bf16", {}, "sdpa"),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_planned_layer_terms_equal_what_autograd_saves(folders, case):
    _, name, finetune, quantization, compute, residual, lora, attn = case
    dtype = DTYPES[compute]
    lora = dict(lora)
    masked = lora.pop("mask", False)
    if finetune == "full":
        model = _full_model(folders[name], dtype, attn)
    else:
        lora = {"target_modules": ALL, "extra_trainable": ["embed_tokens", "norm"], **lora}
        model = _lora_model(folders[name], quantization, dtype, residual, lora, attn)
    config = model.config
    shape = ModelShape.from_config(config)
    setup = Setup(
        seq_len=TOKENS,
        quantization=quantization,
        compute_bytes=dtype.itemsize,
        residual_bytes=DTYPES[residual].itemsize,
        lora_r=lora.get("r", 8),
        lora_targets=tuple(lora.get("target_modules", ())),
        extra_trainable=tuple(lora.get("extra_trainable", ())),
        lora_dropout=lora.get("dropout", 0.0),
        attention=attn,
        checkpointing=False,
        finetune=finetune,
        cuda=False,
        row_mask=masked,
    )
    # Two documents in the row: a block-causal mask, as ctxext's packed rows give SDPA.
    doc = torch.arange(TOKENS) >= TOKENS // 2
    causal = torch.ones(TOKENS, TOKENS, dtype=torch.bool).tril() & (doc[:, None] == doc[None, :])
    measured = _measure(model, causal[None, None] if masked else None)
    planned = layer_bytes(shape, setup)
    detail = "\n".join(f"{x.bytes / TOKENS:8.1f} B/token  {x.what}" for x in layer_saved(shape, setup))
    assert planned == measured, f"planned {planned / TOKENS} B/token, measured {measured / TOKENS}\n{detail}"


def test_gpu_check_measures_the_same_terms_on_the_cpu(folders):
    """scripts/gpu_check.py's planner-term checks run here with the CPU's kernels: the saved tensors equal."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_check import attention_backward_check, saved_layer_check

    for full in (False, True):
        result = saved_layer_check(folders["llama-gqa"], full=full, device_type="cpu")
        assert result["measured"] == result["planned"] > 0, result
    attention = attention_backward_check("sdpa", 256, "cpu", {"heads": 4, "kv": 2, "dim": 16})
    assert attention["planned"] > 0
