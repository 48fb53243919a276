"""Building a transformers model from a local folder: compute dtype, attention implementation, quantization.

:func:`load_weights` is the one place that calls ``AutoModelForCausalLM.from_pretrained`` on a model folder; the
one loader (:func:`ctxext.models.load.load_model`) and training (:mod:`ctxext.training.model`) build on it.
:func:`load_gguf_weights` is its GGUF counterpart, used once per file to convert it (:mod:`ctxext.models.gguf`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from ctxext.errors import InputError

# Quantization modes → the BitsAndBytesConfig arguments they need (None: full precision).
QUANTIZATION_MODES: dict[str, dict[str, Any] | None] = {
    "nf4": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    "int8": {"load_in_8bit": True},
    "none": None,
}

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def compute_dtype_for(setting: str, device: torch.device) -> torch.dtype:
    """The activation dtype: bf16 on CUDA, fp32 on the CPU (bf16 is ~25× slower there), unless set.

    Args:
        setting: ``auto`` or a dtype name.
        device: where the model runs.

    Returns:
        A torch dtype.
    """
    from ctxext.recipe.hardware import compute_dtype_name

    return _DTYPES[compute_dtype_name(setting, device.type == "cuda")]


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
    from ctxext.recipe.hardware import attention_problem, resolve_attention

    cuda, has_flash = device.type == "cuda", importlib.util.find_spec("flash_attn") is not None
    problem = attention_problem(setting, cuda, has_flash)
    if problem:
        raise InputError(f"model.attn_implementation: {problem}")
    return resolve_attention(setting, cuda, has_flash)


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


def load_weights(
    folder: Path,
    config: Any,
    *,
    quantization: str = "none",
    double_quant: bool = True,
    compute_dtype: torch.dtype | str = torch.float32,
    attn_implementation: str = "sdpa",
    device: torch.device | str = "cpu",
    trust_remote_code: bool = False,
    sharded: bool = False,
) -> Any:
    """Load a causal LM's weights from a local folder with a given config, on ``device``.

    Args:
        folder: the local model folder (see :func:`ctxext.models.sources.resolve_model_path`).
        config: the config to build the model with (the folder's, or a patched one).
        quantization: ``nf4``, ``int8`` or ``none``.
        double_quant: nested quantization for nf4.
        compute_dtype: dtype of the non-quantized weights and activations (``"auto"``: the stored dtype).
        attn_implementation: transformers attention implementation.
        device: the device to load onto (each process loads its own copy).
        trust_remote_code: allow custom modeling code.
        sharded: the model will be sharded by FSDP (see :func:`quantization_config`).

    Returns:
        The transformers model.

    Raises:
        InputError: truncated or corrupt weight files (named before transformers fails on them).
    """
    from transformers import AutoModelForCausalLM

    from ctxext.models.weights import check_weights_readable

    device = torch.device(device)
    kwargs: dict[str, Any] = {
        "config": config,
        "dtype": compute_dtype,
        "attn_implementation": attn_implementation,
        "trust_remote_code": trust_remote_code,
    }
    # Damaged files are named as such before transformers fails on them with a traceback.
    check_weights_readable(folder)
    dtype = compute_dtype if isinstance(compute_dtype, torch.dtype) else torch.float32  # 4-bit compute dtype
    qconf = quantization_config(quantization, double_quant, dtype, sharded)
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
    return model


def _keep_cpu_4bit_layout(model: torch.nn.Module) -> None:
    # bitsandbytes 0.50 repacks a 4-bit weight for its AVX512-BF16 CPU kernel the first time the layer
    # runs in eval mode without grad. That repacking asserts out_features % 32 == 0 (the tiny Llama's
    # 176-wide MLP fails) and switches validation and inference to other numerics than training.
    # Keeping the training layout makes train, validation and reload compute the same thing.
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            # A bool attribute of bitsandbytes' layer; nn.Module types attributes as Tensor | Module.
            module.support_avx512bf16_for_cpu = False  # type: ignore[assignment]


def load_gguf_weights(folder: Path, name: str) -> Any:
    """Load a GGUF file through transformers' GGUF support, dequantized to float32 on the CPU.

    The result cannot be saved as it is (transformers marks it as quantized with gguf):
    :func:`ctxext.models.gguf.convert_gguf` rebuilds it as a plain model folder.

    Args:
        folder: the folder holding the file.
        name: the file's name in ``folder``.

    Returns:
        The transformers model.
    """
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
