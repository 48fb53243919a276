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
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ctxext.errors import InputError
from ctxext.rope import RopePlan, patch_model, verify_model_rope
from ctxext.sources import resolve_model_path

# Quantization modes → the BitsAndBytesConfig arguments they need (None: full precision).
QUANTIZATION_MODES: dict[str, dict[str, Any] | None] = {
    "nf4": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    "int8": {"load_in_8bit": True},
    "none": None,
}

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TrainingModel:
    """A model ready to train, and what was done to it.

    Attributes:
        model: the peft model (LoRA + extra trainable modules).
        tokenizer: its tokenizer.
        base_path: the local folder the base came from.
        plan: the RoPE plan applied (``None`` for ``rope.method: none``).
        compute_dtype: the dtype of activations.
        attn_implementation: the attention implementation used.
        extra_trainable: module paths trained in full.
        trainable_params: number of trainable parameters.
        total_params: number of parameters (quantized ones counted as stored).
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


def compute_dtype_for(setting: str, device: torch.device) -> torch.dtype:
    """The activation dtype: bf16 on CUDA, fp32 on the CPU (bf16 is ~25× slower there), unless set.

    Args:
        setting: ``auto`` or a dtype name.
        device: where the model runs.

    Returns:
        A torch dtype.
    """
    if setting != "auto":
        return _DTYPES[setting]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def attention_for(setting: str, device: torch.device) -> str:
    """The attention implementation: flash_attention_2 when installed on CUDA, else SDPA.

    Args:
        setting: ``auto`` or an implementation name.
        device: where the model runs.

    Returns:
        The ``attn_implementation`` string for transformers.

    Raises:
        InputError: flash_attention_2 asked for where it cannot run.
    """
    has_flash = importlib.util.find_spec("flash_attn") is not None
    if setting == "auto":
        return "flash_attention_2" if device.type == "cuda" and has_flash else "sdpa"
    if setting == "flash_attention_2" and (device.type != "cuda" or not has_flash):
        raise InputError(
            "model.attn_implementation: flash_attention_2 needs CUDA and the flash-attn package; use auto or sdpa here"
        )
    return setting


def quantization_config(mode: str, double_quant: bool, dtype: torch.dtype, sharded: bool = False):
    """A ``BitsAndBytesConfig`` for a quantization mode, or ``None`` for full precision.

    Args:
        mode: ``nf4``, ``int8`` or ``none``.
        double_quant: quantize the 4-bit quantization constants too (QLoRA).
        dtype: the compute dtype of 4-bit layers.
        sharded: FSDP will shard the model; 4-bit weights are then stored in ``dtype`` so FSDP can
            flatten them with the other weights (FSDP-QLoRA).

    Returns:
        The config, or ``None``.
    """
    args = QUANTIZATION_MODES[mode]
    if args is None:
        return None
    from transformers import BitsAndBytesConfig

    if mode == "nf4":
        args = {**args, "bnb_4bit_use_double_quant": double_quant, "bnb_4bit_compute_dtype": dtype}
        if sharded:
            args["bnb_4bit_quant_storage"] = dtype
    return BitsAndBytesConfig(**args)


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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ctxext.sources import config_from_folder
    from ctxext.weights import check_weights_readable

    folder = resolve_model_path(path, revision)
    device = torch.device(device)
    kwargs: dict[str, Any] = {
        "dtype": compute_dtype,
        "attn_implementation": attn_implementation,
        "trust_remote_code": trust_remote_code,
    }
    # Damaged files are named as such before transformers fails on them with a traceback.
    kwargs["config"] = config if config is not None else config_from_folder(folder, trust_remote_code)
    check_weights_readable(folder)
    qconf = quantization_config(quantization, double_quant, compute_dtype, sharded)
    if qconf is not None:
        kwargs["quantization_config"] = qconf
        # bitsandbytes layers are placed at load time; the index keeps one process per GPU.
        kwargs["device_map"] = {"": device.index if device.type == "cuda" and device.index is not None else str(device)}
    model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    if qconf is None:
        # transformers decorates PreTrainedModel.to with functools.wraps, which mypy reads as unbound (self first).
        model.to(device)  # type: ignore[arg-type]
    elif device.type == "cpu":
        _keep_cpu_4bit_layout(model)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    if tokenizer.eos_token_id is None:
        raise InputError(f"the tokenizer of {path} has no EOS token; documents could not be separated when packing")
    return model, tokenizer, folder


def _keep_cpu_4bit_layout(model: torch.nn.Module) -> None:
    # bitsandbytes 0.50 repacks a 4-bit weight for its AVX512-BF16 CPU kernel the first time the layer
    # runs in eval mode without grad. That repacking asserts out_features % 32 == 0 (the tiny Llama's
    # 176-wide MLP fails) and switches validation and inference to other numerics than training.
    # Keeping the training layout makes train, validation and reload compute the same thing.
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            # A bool attribute of bitsandbytes' layer; nn.Module types attributes as Tensor | Module.
            module.support_avx512bf16_for_cpu = False  # type: ignore[assignment]


def _matched_modules(model: torch.nn.Module, suffixes: list[str]) -> list[str]:
    # The same rule peft applies to modules_to_save: a module whose path ends with a listed name.
    return [name for name, _ in model.named_modules() if name and any(name.endswith(s) for s in suffixes)]


def add_lora(model: Any, lora: Any, gradient_checkpointing: bool, quantized: bool) -> tuple[Any, list[str]]:
    """Wrap a (possibly quantized) model with LoRA and fully trainable extra modules.

    Args:
        model: the base causal LM (already RoPE-patched).
        lora: the recipe's ``lora`` section (``r``, ``alpha``, ``dropout``, ``target_modules``,
            ``extra_trainable``).
        gradient_checkpointing: recompute activations in the backward pass.
        quantized: the base is 4-bit or 8-bit (peft's k-bit preparation is applied).

    Returns:
        ``(peft model, names of the extra trainable modules)``.

    Raises:
        InputError: target modules or extra modules that match nothing.
    """
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    names = [n for n, _ in model.named_modules()]
    missing = [t for t in lora.target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        leaves = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise InputError(
            f"lora.target_modules: {', '.join(missing)} match no module of this model; "
            f"its linear layers are named: {', '.join(leaves)}"
        )
    extra = _matched_modules(model, list(lora.extra_trainable))
    unmatched = [s for s in lora.extra_trainable if not any(n.endswith(s) for n in extra)]
    if unmatched:
        raise InputError(
            f"lora.extra_trainable: {', '.join(unmatched)} match no module name suffix of this model "
            "(e.g. embed_tokens, norm)"
        )
    ckpt_kwargs = {"use_reentrant": False}  # non-reentrant checkpointing works with DDP and frozen inputs
    if quantized:
        # peft would enable checkpointing through transformers' deprecated `gradient_checkpointing_enable`
        # (removed in v6); with non-reentrant checkpointing its input-grad hack is not needed, so enable it here.
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if gradient_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=ckpt_kwargs)
    if gradient_checkpointing:
        model.config.use_cache = False
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        modules_to_save=list(lora.extra_trainable) or None,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config), extra


def build_training_model(recipe: Any, device: torch.device | str = "cpu", sharded: bool = False) -> TrainingModel:
    """Load, patch, quantize and LoRA-wrap the recipe's model: everything before the training loop.

    Args:
        recipe: a validated :class:`ctxext.config.Recipe`.
        device: this process's device.
        sharded: FSDP will shard the model.

    Returns:
        A :class:`TrainingModel`.
    """
    device = torch.device(device)
    dtype = compute_dtype_for(recipe.quantization.compute_dtype, device)
    attn = attention_for(recipe.model.attn_implementation, device)
    model, tokenizer, folder = load_base(
        recipe.model.path,
        quantization=recipe.quantization.mode,
        double_quant=recipe.quantization.double_quant,
        compute_dtype=dtype,
        attn_implementation=attn,
        device=device,
        revision=recipe.model.revision,
        trust_remote_code=recipe.model.trust_remote_code,
        sharded=sharded,
    )
    plan = None
    if recipe.rope.method != "none":
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
    peft_model, extra = add_lora(
        model, recipe.lora, recipe.train.gradient_checkpointing, recipe.quantization.mode != "none"
    )
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
    )


def load_for_inference(
    base: str | None,
    adapter_dir: str | Path,
    *,
    quantization: str | None = "auto",
    device: torch.device | str = "cpu",
    compute_dtype: torch.dtype | None = None,
    attn_implementation: str = "auto",
) -> tuple[Any, Any]:
    """Reload a base model with a trained adapter, using the adapter's patched RoPE config, and verify RoPE.

    Args:
        base: the base model reference; ``None`` reads it from the run folder's ``run.json``.
        adapter_dir: a ``ctxext train`` run folder (or any folder with a peft adapter and a
            patched ``config.json``).
        quantization: ``auto`` (the run's own quantization, which reproduces the trained model's
            logits), ``nf4``, ``int8`` or ``none``.
        device: where to load.
        compute_dtype: activation dtype (default: bf16 on CUDA, fp32 on CPU).
        attn_implementation: ``auto``, ``sdpa``, ``eager`` or ``flash_attention_2``.

    Returns:
        ``(peft model in eval mode, tokenizer)``.

    Raises:
        InputError: a folder without an adapter or without a config.
    """
    from peft import PeftModel
    from transformers import AutoConfig, AutoTokenizer

    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise InputError(f"{adapter_dir} has no adapter_config.json; point at a `ctxext train` run folder")
    if not (adapter_dir / "config.json").is_file():
        raise InputError(f"{adapter_dir} has no config.json (the patched base config); it is not a ctxext run folder")
    run = {}
    if (adapter_dir / "run.json").is_file():
        run = json.loads((adapter_dir / "run.json").read_text())
    if base is None:
        base = run.get("base_model")
        if base is None:
            raise InputError(f"{adapter_dir}/run.json does not name the base model; pass it explicitly")
    if quantization in (None, "auto"):
        quantization = run.get("quantization", "none")
    device = torch.device(device)
    dtype = compute_dtype or compute_dtype_for("auto", device)
    config = AutoConfig.from_pretrained(adapter_dir)
    model, _, _ = load_base(
        base,
        quantization=quantization,
        compute_dtype=dtype,
        attn_implementation=attention_for(attn_implementation, device),
        device=device,
        config=config,
    )
    # The rotary modules were built from the patched config at load time; check they really are.
    verify_model_rope(model)
    model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    tok_dir = adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else resolve_model_path(base)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    return model, tokenizer
