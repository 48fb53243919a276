"""Loading a base model for long-context fine-tuning: quantization, attention, RoPE patch, LoRA.

The order matters and is the same everywhere: load (4-bit / 8-bit / full) with the chosen attention
implementation → patch RoPE and verify the runtime frequencies → gradient checkpointing → LoRA on
the projections, with embeddings and norms trained in full beside it (LongLoRA: LoRA alone is
clearly worse at long context).

Extra trainable modules use peft's ``modules_to_save``: a full trainable copy of each matched module,
saved inside ``adapter_model.safetensors`` and restored by ``PeftModel.from_pretrained``. It works
with 4-bit bases because embeddings and norms are never quantized. peft matches these names as
*suffixes* of module paths, so ``norm`` selects every ``*norm`` (input_layernorm,
post_attention_layernorm and the final ``model.norm``); the matched names are reported.

On a base with tied embeddings (``lm_head`` is the input embedding matrix) a trained embedding stays tied:
peft's ``ensure_weight_tying`` wraps ``lm_head`` with the same trainable copy, so the shared matrix is trained
in both roles, merges as one tensor, and the model keeps its size (docs/training.md says why it is trained).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ctxext.errors import InputError
from ctxext.models.build import attention_for, compute_dtype_for, load_weights
from ctxext.models.embeddings import embeddings_tied
from ctxext.models.sources import resolve_model_path
from ctxext.recipe.refusals import lora_module_problems, matched_modules, resolve_lora_names
from ctxext.rope.runtime import RopeSnapshot, patch_model, verify_model_rope
from ctxext.rope.types import RopePlan


@dataclass
class TrainingModel:
    """A model ready to train, and what was done to it.

    Attributes:
        model: the peft model (LoRA + extra trainable modules), or the model itself in a full fine-tune.
        tokenizer: its tokenizer.
        base_path: the local folder the base came from.
        plan: the RoPE plan applied (``None`` for ``rope.method: none``).
        compute_dtype: the dtype of activations (a full fine-tune's weights are fp32 master copies).
        attn_implementation: the attention implementation used.
        extra_trainable: module paths trained in full.
        trainable_params: number of trainable parameters.
        total_params: number of parameters (quantized ones counted as stored).
        levers: the memory levers used (``train.memory``, resolved: :class:`ctxext.recipe.memory.Levers`).
        original_rope: the base's RoPE setting before the extension (the adaptive stop checks the base's window
            with it); ``None`` when nothing was extended.
    """

    model: Any
    tokenizer: Any
    base_path: Path
    plan: RopePlan | None
    compute_dtype: torch.dtype
    attn_implementation: str
    extra_trainable: list[str] = field(default_factory=list)
    trainable_params: int = 0
    total_params: int = 0
    levers: dict[str, Any] = field(default_factory=dict)
    original_rope: RopeSnapshot | None = None


def load_base(
    path: str,
    *,
    quantization: str = "nf4",
    double_quant: bool = True,
    compute_dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    device: torch.device | str = "cpu",
    config: Any = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    sharded: bool = False,
) -> tuple[Any, Any, Path]:
    """Load a causal LM and its tokenizer from a folder, a Hub id or ``builtin:NAME``.

    Args:
        path: the model reference.
        quantization: ``nf4``, ``int8`` or ``none``.
        double_quant: nested quantization for nf4.
        compute_dtype: dtype of the non-quantized weights and activations.
        attn_implementation: transformers attention implementation.
        device: the device to load onto (each process loads its own copy).
        config: a config to use instead of the folder's (e.g. an already patched one).
        revision: Hub revision.
        trust_remote_code: allow custom modeling code.
        sharded: the model will be sharded by FSDP (see :func:`quantization_config`).

    Returns:
        ``(model, tokenizer, local folder)``.
    """
    from transformers import AutoTokenizer

    from ctxext.models.sources import config_from_folder

    folder = resolve_model_path(path, revision)
    config = config if config is not None else config_from_folder(folder, trust_remote_code)
    model = load_weights(
        folder,
        config,
        quantization=quantization,
        double_quant=double_quant,
        compute_dtype=compute_dtype,
        attn_implementation=attn_implementation,
        device=device,
        trust_remote_code=trust_remote_code,
        sharded=sharded,
    )
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    if tokenizer.eos_token_id is None:
        raise InputError(f"the tokenizer of {path} has no EOS token; documents could not be separated when packing")
    return model, tokenizer, folder


def add_lora(
    model: Any, lora: Any, gradient_checkpointing: bool, quantized: bool, levers: Any = None
) -> tuple[Any, list[str]]:
    """Wrap a (possibly quantized) model with LoRA and fully trainable extra modules.

    Args:
        model: the base causal LM (already RoPE-patched).
        lora: the recipe's ``lora`` section (``r``, ``alpha``, ``dropout``, ``target_modules``,
            ``extra_trainable``).
        gradient_checkpointing: recompute activations in the backward pass.
        quantized: the base is 4-bit or 8-bit (peft's k-bit preparation is applied).
        levers: the memory levers (:class:`ctxext.recipe.memory.Levers`); ``None``: none.

    Returns:
        ``(peft model, names of the extra trainable modules)``.

    Raises:
        InputError: target modules or extra modules that match nothing.
    """
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    problems = lora_module_problems(model, lora)
    if problems:
        raise InputError(f"{problems[0][0]}: {problems[0][1]}")
    targets, extras = resolve_lora_names(model, list(lora.target_modules), list(lora.extra_trainable))
    extra = matched_modules(model, extras)
    # A tied base trains its shared embedding as one matrix (peft wraps lm_head with the same copy): no silent untie
    # at merge, and no peft warning about tying for the user to decode.
    tie = embeddings_tied(model) and model.get_input_embeddings() in [model.get_submodule(n) for n in extra]
    if quantized:
        # peft would enable checkpointing through transformers' deprecated `gradient_checkpointing_enable`
        # (removed in v6); with non-reentrant checkpointing its input-grad hack is not needed, so enable it here.
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    _checkpointing(model, gradient_checkpointing, levers)
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        modules_to_save=extras or None,
        bias="none",
        task_type="CAUSAL_LM",
        ensure_weight_tying=tie,
    )
    peft_model = get_peft_model(model, config)
    if levers is not None:
        from ctxext.training.levers import apply_levers

        apply_levers(peft_model, levers)
    return peft_model, extra


def _checkpointing(model: Any, enabled: bool, levers: Any) -> None:
    """Recompute activations in the backward pass (non-reentrant: works with DDP, FSDP and frozen inputs)."""
    if enabled:
        offload = bool(levers and levers.offload_checkpoints)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False}, offload=offload)
        model.config.use_cache = False


def prepare_full(model: Any, gradient_checkpointing: bool, levers: Any = None) -> Any:
    """Make every weight of ``model`` trainable (``train.mode: full``), with checkpointing and the memory levers.

    Args:
        model: the base causal LM (already RoPE-patched), in its master dtype (fp32).
        gradient_checkpointing: recompute activations in the backward pass.
        levers: the memory levers (:class:`ctxext.recipe.memory.Levers`); ``None``: none.

    Returns:
        The model itself.
    """
    model.requires_grad_(True)
    _checkpointing(model, gradient_checkpointing, levers)
    if levers is not None:
        from ctxext.training.levers import apply_levers

        apply_levers(model, levers)
    return model


def build_training_model(recipe: Any, device: torch.device | str = "cpu", sharded: bool = False) -> TrainingModel:
    """Load, patch, quantize and LoRA-wrap the recipe's model: everything before the training loop.

    A full fine-tune (``train.mode: full``) skips the adapters: every weight trains, held as fp32 master copies;
    accelerate's mixed precision computes in ``quantization.compute_dtype`` (``start_accelerator``).

    Args:
        recipe: a validated :class:`ctxext.recipe.schema.Recipe`.
        device: this process's device.
        sharded: FSDP will shard the model.

    Returns:
        A :class:`TrainingModel`.
    """
    device = torch.device(device)
    dtype = compute_dtype_for(recipe.quantization.compute_dtype, device)
    attn = attention_for(recipe.model.attn_implementation, device)
    from ctxext.recipe.memory import recipe_levers
    from ctxext.training.levers import configure_allocator

    # The levers are checked before anything is loaded, and the allocator set before the weights are allocated.
    levers = recipe_levers(recipe, device.type, str(dtype).removeprefix("torch."))
    levers = dataclasses.replace(levers, expandable_segments=configure_allocator(levers.expandable_segments))
    full = recipe.train.mode == "full"
    model, tokenizer, folder = load_base(
        recipe.model.path,
        quantization=recipe.quantization.mode,
        double_quant=recipe.quantization.double_quant,
        compute_dtype=torch.float32 if full else dtype,
        attn_implementation=attn,
        device=device,
        revision=recipe.model.revision,
        trust_remote_code=recipe.model.trust_remote_code,
        sharded=sharded,
    )
    plan = original = None
    if recipe.rope.method != "none":
        original = RopeSnapshot(model)
        plan = patch_model(
            model,
            recipe.rope.method,
            int(recipe.rope.target_length),
            recipe.rope.options(),
            recipe.model.original_length,
            relative_to=recipe.rope.relative_to,
        )
    else:
        verify_model_rope(model)
    quantized, ckpt = recipe.quantization.mode != "none", recipe.train.checkpointing
    extra: list[str] = []
    if full:
        peft_model = prepare_full(model, ckpt, levers)
    else:
        peft_model, extra = add_lora(model, recipe.lora, ckpt, quantized, levers)
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    return TrainingModel(
        model=peft_model,
        tokenizer=tokenizer,
        base_path=folder,
        plan=plan,
        compute_dtype=dtype,
        attn_implementation=attn,
        extra_trainable=extra,
        trainable_params=trainable,
        total_params=total,
        levers=levers.record(),
        original_rope=original,
    )
