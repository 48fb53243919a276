"""Loading model weights: compute dtype, attention implementation, quantization, and inference reloads.

The shared loading steps (:func:`load_weights` with its dtype, attention and bitsandbytes choices) used by
training (:mod:`ctxext.models.training_model`) and by evaluation; :func:`load_inference_model` reloads a
base with a run's patched config and adapter; :func:`load_for_inference` is its notebook form.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ctxext.artifacts.run import find_adapter_dir
from ctxext.errors import InputError
from ctxext.models.sources import resolve_model_path
from ctxext.rope.runtime import RopeCheck, verify_model_rope

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


def load_weights(
    folder: Path,
    config: Any,
    *,
    quantization: str = "none",
    double_quant: bool = True,
    compute_dtype: torch.dtype = torch.float32,
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
        compute_dtype: dtype of the non-quantized weights and activations.
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


@dataclass
class InferenceModel:
    """A base model reloaded for inference, with its adapter attached, and where each part came from.

    Attributes:
        model: the causal LM in eval mode (a ``PeftModel`` when an adapter is attached).
        tokenizer: its tokenizer.
        base: the base model reference (folder, Hub id or ``builtin:NAME``).
        base_path: the local folder the base weights came from.
        adapter_dir: the folder holding ``adapter_config.json``, or ``None``.
        config_from: the folder whose ``config.json`` the base runs with (``None``: the base's own).
        compute_dtype: the dtype of the non-quantized weights and activations.
        rope_check: the runtime RoPE verification (``None`` when not verified).
        attention_temperature: the factor the attention logits run with (a calibrated run's, else 1.0).
    """

    model: Any
    tokenizer: Any
    base: str
    base_path: Path
    adapter_dir: Path | None
    config_from: str | None
    compute_dtype: torch.dtype
    rope_check: RopeCheck | None
    attention_temperature: float = 1.0


def _run_folder_of(adapter: str | Path | None, adapter_dir: Path | None) -> Path | None:
    # The ctxext run folder an adapter belongs to: the folder given, or the run above its adapter/final subfolder.
    from ctxext.artifacts.run import RUN_FILE

    if adapter is None or adapter_dir is None:
        return None
    above = [adapter_dir.parent] if adapter_dir.name in ("adapter", "final") else []
    for cand in (Path(adapter), adapter_dir, *above):
        if (cand / RUN_FILE).is_file():
            return cand
    return None


def load_inference_model(
    base: str | None,
    adapter: str | Path | None = None,
    *,
    config_from: str | Path | None = None,
    revision: str | None = None,
    quantization: str = "none",
    compute_dtype: torch.dtype | None = None,
    attn_implementation: str = "sdpa",
    device: torch.device | str = "cpu",
    verify: bool = True,
    what: str | None = None,
    calibrated: bool = True,
) -> InferenceModel:
    """Load a base model (with the patched config of its run) and attach an adapter: the one inference loader.

    A ctxext run folder writes the patched base config next to its adapter; the base weights are built
    with that config, so the rotary modules carry the patched RoPE, and the runtime RoPE is verified
    before the adapter goes on.

    Args:
        base: the base model reference; ``None`` reads it from ``adapter``'s ``run.json`` (a ctxext run
            folder) and checks that the base weights are still the ones the run was trained on.
        adapter: an adapter folder or a ctxext run folder (its ``adapter`` / ``final`` subfolder is found too).
        config_from: a folder whose ``config.json`` replaces the base's (default: the adapter's, when it has one).
        revision: Hub revision of ``base``.
        quantization: ``nf4``, ``int8`` or ``none``.
        compute_dtype: dtype of activations (default: bf16 on CUDA, fp32 on the CPU).
        attn_implementation: transformers attention implementation (already resolved, see :func:`attention_for`).
        device: where to load.
        verify: check the runtime RoPE against the reference (raises on a mismatch).
        what: the command, for the message when a run's base weights changed (default ``loading RUN``).
        calibrated: apply a calibrated run's attention temperature (``calibration.json``); ``ctxext calibrate``
            loads without it, so an earlier record, stale or not, does not stand in its way.

    Returns:
        An :class:`InferenceModel`.

    Raises:
        InputError: an adapter folder without an adapter, an unusable run folder, damaged files, no tokenizer.
        ctxext.rope.types.RopeMismatchError: the runtime RoPE differs from the config.
    """
    from ctxext.artifacts.run import RUN_FILE, run_base_model
    from ctxext.models.sources import config_from_folder
    from ctxext.models.temperature import run_temperature, set_attention_temperature
    from ctxext.models.weights import check_fingerprint, check_weights_readable

    device = torch.device(device)
    dtype = compute_dtype or compute_dtype_for("auto", device)
    adapter_dir: Path | None = None
    if adapter is not None:
        adapter_dir = find_adapter_dir(adapter)
        if adapter_dir is None:
            raise InputError(f"adapter folder {adapter} has no adapter_config.json (a peft / ctxext run folder)")
        # A ctxext run writes the patched config next to its adapter; the base must run with it.
        if config_from is None:
            config_from = next((c for c in (Path(adapter), adapter_dir) if (c / "config.json").is_file()), None)
    run_dir = _run_folder_of(adapter, adapter_dir)
    if base is None and run_dir is not None:
        base = run_base_model(run_dir)
    if base is None:
        raise InputError("no base model: name one, or give a ctxext run folder whose run.json names it")
    base_dir = resolve_model_path(base, revision)
    if run_dir is not None:
        # Whether the base comes from run.json or is named beside the run's adapter, it must be the weights the
        # adapter was trained on. Damaged weight files are named as such before the fingerprint check reads them.
        check_weights_readable(base_dir)
        run = json.loads((run_dir / RUN_FILE).read_text())
        check_fingerprint(base_dir, run.get("base_fingerprint"), what or f"loading {run_dir}")
    config = config_from_folder(config_from or base_dir)
    model = load_weights(
        base_dir,
        config,
        quantization=quantization,
        compute_dtype=dtype,
        attn_implementation=attn_implementation,
        device=device,
    )
    # The rotary modules were built from the (patched) config at load time; check they really are.
    check = verify_model_rope(model) if verify else None
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False)
    # A calibrated run (``ctxext calibrate``) runs with its attention temperature; a merged model has it folded in.
    temperature = run_temperature(run_dir) if calibrated else 1.0
    if temperature != 1.0:
        set_attention_temperature(model, temperature)
    model.eval()
    tokenizer = _find_tokenizer([str(p) for p in (adapter, config_from, base_dir) if p])
    return InferenceModel(
        model=model,
        tokenizer=tokenizer,
        base=base,
        base_path=base_dir,
        adapter_dir=adapter_dir,
        config_from=str(config_from) if config_from is not None else None,
        compute_dtype=dtype,
        rope_check=check,
        attention_temperature=temperature,
    )


def load_tokenizer_and_config(ref: str, revision: str | None = None) -> tuple[Any, Any]:
    """The tokenizer and config of a model, without its weights (what prompts for it are built from).

    Args:
        ref: a model folder, ``builtin:NAME``, Hub id, or ctxext run folder (its patched config, and its own
            tokenizer or else its base's).
        revision: Hub revision of ``ref``.

    Returns:
        ``(tokenizer, config)``.

    Raises:
        InputError: no tokenizer next to the model; SourceError: the model cannot be found.
    """
    from ctxext.artifacts.run import is_run_folder, run_base_model
    from ctxext.models.sources import config_from_folder, load_config

    if is_run_folder(ref):
        base = resolve_model_path(run_base_model(ref))
        return _find_tokenizer([ref, str(base)]), config_from_folder(ref)
    config, folder = load_config(ref, revision)
    if folder.is_dir():
        return _find_tokenizer([str(folder)]), config
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ref, revision=revision), config  # a Hub id: its tokenizer files only


def _find_tokenizer(candidates: list[str]) -> Any:
    from transformers import AutoTokenizer

    for cand in candidates:
        p = Path(cand)
        if p.is_dir() and any(
            (p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
        ):
            return AutoTokenizer.from_pretrained(p)
    raise InputError(f"no tokenizer found in {', '.join(candidates)}; save the tokenizer next to the model")


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

    The run folder's own checks and its quantization, on top of :func:`load_inference_model`.

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
    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise InputError(f"{adapter_dir} has no adapter_config.json; point at a `ctxext train` run folder")
    if not (adapter_dir / "config.json").is_file():
        raise InputError(f"{adapter_dir} has no config.json (the patched base config); it is not a ctxext run folder")
    run = {}
    if (adapter_dir / "run.json").is_file():
        run = json.loads((adapter_dir / "run.json").read_text())
    if base is None and run.get("base_model") is None:
        raise InputError(f"{adapter_dir}/run.json does not name the base model; pass it explicitly")
    if quantization in (None, "auto"):
        quantization = run.get("quantization", "none")
    device = torch.device(device)
    loaded = load_inference_model(
        base,
        adapter_dir,
        quantization=str(quantization),
        compute_dtype=compute_dtype,
        attn_implementation=attention_for(attn_implementation, device),
        device=device,
    )
    return loaded.model, loaded.tokenizer
