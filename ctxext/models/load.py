"""The one model loader: a folder, a Hub id, ``builtin:NAME``, a ctxext run folder, or base + adapter.

Evaluation, calibration, search, merge and export load through :func:`load_model`; training builds on
the same weights step (:func:`ctxext.models.build.load_weights`) and adds quantization and adapters. It is
where a reference is resolved to a local folder (built-ins included), a run's patched config and adapter are
put together, the base weights are checked against the run's fingerprint, the runtime RoPE is verified
against ctxext's reference, and a calibrated run's attention temperature is applied — once, for every caller.

A ctxext run folder holds ``run.json`` (naming the base model), the LoRA adapter (``adapter_config.json`` +
weights) and a ``config.json`` that carries the patched RoPE. The base weights are built with that config, so
the rotary modules carry the patched settings, and the adapter goes on top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from ctxext.errors import InputError
from ctxext.models.build import attention_for, compute_dtype_for, load_weights
from ctxext.rope.read import read_rope
from ctxext.rope.runtime import RopeCheck, verify_model_rope
from ctxext.rope.types import RopeState

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class ModelSpec:
    """What to load.

    Attributes:
        ref: a model folder, Hub id, ``builtin:NAME``, or a ctxext run folder (its base plus its adapter).
        adapter: a LoRA adapter folder applied on top of ``ref`` (a peft folder or a ctxext run folder).
        name: the label used in reports (default: derived from ``ref`` / ``adapter``).
        config_from: a folder whose ``config.json`` replaces the base's config (e.g. the patched RoPE of a
            run, for the "patched only" comparison without the adapter).
        revision: Hub revision of ``ref``.
    """

    ref: str
    adapter: str | None = None
    name: str | None = None
    config_from: str | None = None
    revision: str | None = None

    def label(self) -> str:
        """The name shown in reports."""
        if self.name:
            return self.name
        base = Path(self.ref).name or self.ref
        if self.adapter:
            return f"{base}+{Path(self.adapter).name}"
        if self.config_from:
            return f"{base} (patched)"
        return base


@dataclass
class LoadedModel:
    """A loaded model, in eval mode, and where each part of it came from.

    Attributes:
        name: report label.
        model: the causal LM (a ``PeftModel`` when an adapter is attached).
        tokenizer: its tokenizer.
        rope: the RoPE state of the config the model runs with.
        info: JSON-ready description (references, dtype, parameters) for reports.
        base: the base model reference (folder, Hub id or ``builtin:NAME``).
        base_path: the local folder the base weights came from.
        adapter_dir: the folder holding ``adapter_config.json``, or ``None``.
        run_dir: the ctxext run folder the adapter belongs to, or ``None``.
        config_from: the folder whose ``config.json`` the base runs with (``None``: the base's own).
        compute_dtype: the dtype of the non-quantized weights and activations.
        rope_check: the runtime RoPE verification (``None`` when not verified).
        attention_temperature: the factor the attention logits run with (a calibrated run's, else 1.0).
    """

    name: str
    model: torch.nn.Module
    tokenizer: Any
    rope: RopeState
    info: dict[str, Any] = field(default_factory=dict)
    base: str = ""
    base_path: Path = Path()
    adapter_dir: Path | None = None
    run_dir: Path | None = None
    config_from: str | None = None
    compute_dtype: torch.dtype = torch.float32
    rope_check: RopeCheck | None = None
    attention_temperature: float = 1.0

    @property
    def context_length(self) -> int:
        """The context the model is configured for (``max_position_embeddings``)."""
        return int(self.rope.current_length)

    @property
    def original_length(self) -> int:
        """The pretraining context its scaling is relative to."""
        return int(self.rope.original_length)

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters."""
        return next(self.model.parameters()).device

    @property
    def base_model(self) -> PreTrainedModel:
        """The transformers model under a peft wrapper (or the model itself)."""
        return base_model(self.model)


def pick_device(device: str | None = None) -> torch.device:
    """``cuda`` when available (unless told otherwise), else the CPU (:func:`ctxext.models.devices.resolve_device`)."""
    from ctxext.models.devices import resolve_device

    return resolve_device(device)


def base_model(model: torch.nn.Module) -> PreTrainedModel:
    """The transformers model under a peft wrapper (or the model itself): where RoPE and the config live."""
    getter = getattr(model, "get_base_model", None)
    return cast("PreTrainedModel", getter() if callable(getter) else model)


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


@dataclass
class _Parts:
    """A spec resolved to local parts: base folder, adapter, run folder, config folder."""

    base: str
    base_dir: Path
    adapter: str | None
    adapter_dir: Path | None
    run_dir: Path | None
    config_from: str | Path | None


def _resolve(spec: ModelSpec, what: str | None) -> _Parts:
    """Resolve a spec to local parts, checking a run's base weights against the ones it was trained on."""
    from ctxext.artifacts.run import RunRecord, find_adapter_dir, is_full_run, is_run_folder, run_base_model
    from ctxext.models.sources import resolve_model_path
    from ctxext.models.weights import check_adapter_readable, check_fingerprint, check_weights_readable

    # A ctxext run folder as the model means its base plus its adapter, with the run's patched config.
    from_run = spec.adapter is None and is_run_folder(spec.ref)
    base: str | None = None if from_run else spec.ref
    adapter = spec.ref if from_run else spec.adapter
    config_from: str | Path | None = spec.config_from
    adapter_dir: Path | None = None
    if adapter is not None:
        adapter_dir = find_adapter_dir(adapter)
        if adapter_dir is None:
            raise InputError(f"adapter folder {adapter} has no adapter_config.json (a peft / ctxext run folder)")
        check_adapter_readable(adapter_dir)  # a truncated adapter is named here, not deep inside peft
        # A ctxext run writes the patched config next to its adapter; the base must run with it.
        if config_from is None:
            config_from = next((c for c in (Path(adapter), adapter_dir) if (c / "config.json").is_file()), None)
    run_dir = _run_folder_of(adapter, adapter_dir)
    run = RunRecord.read(run_dir) if run_dir is not None else None
    if adapter is None and is_full_run(spec.ref):
        # A full fine-tune's run folder is the model itself; it is still a run (its calibration applies).
        run_dir = Path(spec.ref)
    if base is None and run is not None:
        base = run_base_model(run)
    if base is None:
        raise InputError("no base model: name one, or give a ctxext run folder whose run.json names it")
    base_dir = resolve_model_path(base, spec.revision)
    if run is not None:
        # Whether the base comes from run.json or is named beside the run's adapter, it must be the weights the
        # adapter was trained on. Damaged weight files are named as such before the fingerprint check reads them.
        check_weights_readable(base_dir)
        check_fingerprint(base_dir, run.base_fingerprint, what or f"loading {run_dir}")
    return _Parts(base, base_dir, adapter, adapter_dir, run_dir, config_from)


def load_model(
    spec: ModelSpec | str,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    *,
    quantization: str = "none",
    attn_implementation: str = "sdpa",
    verify: bool = True,
    calibrated: bool = True,
    what: str | None = None,
) -> LoadedModel:
    """Load a model (base, base + adapter, or a ctxext run), verify its runtime RoPE, and put it in eval mode.

    Args:
        spec: what to load (see :class:`ModelSpec`; a string is a ``ref``).
        device: ``cpu`` / ``cuda`` (default: cuda when available).
        dtype: compute dtype (default: bf16 on CUDA, fp32 on the CPU).
        quantization: ``nf4``, ``int8`` or ``none`` (a run's own quantization reproduces its trained logits).
        attn_implementation: ``auto``, ``sdpa``, ``eager`` or ``flash_attention_2``.
        verify: check the runtime RoPE against the reference (raises on a mismatch).
        calibrated: run a calibrated run with its attention temperature (``ctxext calibrate`` measures without,
            so an earlier record, stale or not, does not stand in its way).
        what: the command, for the message when a run's base weights changed (default ``loading RUN``).

    Returns:
        A :class:`LoadedModel`.

    Raises:
        InputError: an adapter folder without an adapter, an unusable run folder, damaged files, no tokenizer.
        ctxext.rope.types.RopeMismatchError: the runtime RoPE differs from the config.
    """
    from ctxext.models.sources import config_from_folder
    from ctxext.models.temperature import run_temperature, set_attention_temperature

    spec = ModelSpec(spec) if isinstance(spec, str) else spec
    dev = device if isinstance(device, torch.device) else pick_device(device)
    compute_dtype = dtype or compute_dtype_for("auto", dev)
    parts = _resolve(spec, what)
    attention = attention_for(attn_implementation, dev)
    config = config_from_folder(parts.config_from or parts.base_dir)
    model = load_weights(
        parts.base_dir,
        config,
        quantization=quantization,
        compute_dtype=compute_dtype,
        attn_implementation=attention,
        device=dev,
    )
    # The rotary modules were built from the (patched) config at load time; check they really are.
    check = verify_model_rope(model) if verify else None
    if parts.adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(parts.adapter_dir), is_trainable=False)
    # A calibrated run (``ctxext calibrate``) runs with its attention temperature; a merged model has it folded in.
    temperature = run_temperature(parts.run_dir) if calibrated else 1.0
    if temperature != 1.0:
        set_attention_temperature(model, temperature)
    model.eval()
    tokenizer = find_tokenizer([str(p) for p in (parts.adapter, parts.config_from, parts.base_dir) if p])
    label = spec.label()
    info = {
        "name": label,
        "ref": spec.ref,
        "base": parts.base,
        "base_path": str(parts.base_dir),
        "adapter": str(parts.adapter_dir) if parts.adapter_dir else None,
        "config_from": str(parts.config_from) if parts.config_from is not None else None,
        "dtype": str(compute_dtype).replace("torch.", ""),
        "device": str(dev),
        "attention": attention,
        "quantization": quantization,
        "parameters": sum(p.numel() for p in model.parameters()),
        "rope_verified": bool(check and check.ok),
        "attention_temperature": temperature,
    }
    return LoadedModel(
        name=label,
        model=model,
        tokenizer=tokenizer,
        rope=read_rope(base_model(model).config),
        info=info,
        base=parts.base,
        base_path=parts.base_dir,
        adapter_dir=parts.adapter_dir,
        run_dir=parts.run_dir,
        config_from=info["config_from"],
        compute_dtype=compute_dtype,
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
    from ctxext.models.sources import config_from_folder, load_config, resolve_model_path

    if is_run_folder(ref):
        base = resolve_model_path(run_base_model(ref))
        return find_tokenizer([ref, str(base)]), config_from_folder(ref)
    config, folder = load_config(ref, revision)
    if folder.is_dir():
        return find_tokenizer([str(folder)]), config
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ref, revision=revision), config  # a Hub id: its tokenizer files only


def find_tokenizer(candidates: list[str]) -> Any:
    """The tokenizer of the first folder among ``candidates`` that holds one.

    Raises:
        InputError: none of them holds a tokenizer.
    """
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

    The notebook form of :func:`load_model` for a run folder, with the run's own quantization by default.

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
    from ctxext.artifacts.run import RUN_FILE, RunRecord

    run = RunRecord.read(adapter_dir) if (adapter_dir / RUN_FILE).is_file() else None
    if base is None and run is None:
        raise InputError(f"{adapter_dir} has no {RUN_FILE} naming the base model; pass the base explicitly")
    if quantization in (None, "auto"):
        quantization = run.quantization if run is not None and run.quantization else "none"
    spec = ModelSpec(str(adapter_dir)) if base is None else ModelSpec(base, adapter=str(adapter_dir))
    loaded = load_model(
        spec,
        torch.device(device),
        compute_dtype,
        quantization=str(quantization),
        attn_implementation=attn_implementation,
    )
    return loaded.model, loaded.tokenizer


def parse_model_specs(
    models: list[str], adapters: list[str] | None = None, names: list[str] | None = None
) -> list[ModelSpec]:
    """Pair ``--model`` / ``--adapter`` / ``--name`` options into specs.

    ``--adapter`` is either given once per ``--model`` (``none`` for a model without one), or once for
    a single ``--model``.

    Args:
        models: model references.
        adapters: adapter folders.
        names: report labels.

    Returns:
        One :class:`ModelSpec` per model.

    Raises:
        InputError: the counts do not pair up.
    """
    if not models:
        raise InputError("give at least one --model")
    adapters = adapters or []
    names = names or []
    if adapters and len(adapters) != len(models):
        raise InputError(
            f"{len(adapters)} --adapter for {len(models)} --model: give one --adapter per --model "
            "(use 'none' for a model without an adapter)"
        )
    if names and len(names) != len(models):
        raise InputError(f"{len(names)} --name for {len(models)} --model: give one name per model")
    specs = []
    for i, ref in enumerate(models):
        adapter = adapters[i] if adapters else None
        if adapter is not None and adapter.lower() in ("none", "-", ""):
            adapter = None
        specs.append(ModelSpec(ref=ref, adapter=adapter, name=names[i] if names else None))
    labels = [s.label() for s in specs]
    for i, label in enumerate(labels):
        if labels.count(label) > 1:
            specs[i].name = f"{label}#{i + 1}"
    return specs
