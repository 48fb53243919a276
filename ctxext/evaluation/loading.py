"""Loading models for evaluation: a folder, a Hub id, ``builtin:NAME``, a ctxext run folder, or base + adapter.

Every model is loaded in float32 on the CPU (bf16 on a GPU) with SDPA attention, and its runtime
RoPE is verified against ctxext's reference before any number is computed: an evaluation of a
model whose scaling was silently dropped would measure the wrong thing.

A ctxext run folder holds ``run.json`` (naming the base model), the LoRA adapter
(``adapter_config.json`` + weights) and a ``config.json`` that carries the patched RoPE. The base
weights are loaded with that config, so the rotary modules are built with the patched settings, and
the adapter is applied on top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from ctxext.errors import InputError
from ctxext.rope.read import read_rope
from ctxext.rope.types import RopeState

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class ModelSpec:
    """What to load.

    Attributes:
        ref: a model folder, Hub id, ``builtin:NAME``, or a ctxext run folder.
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
    """A model ready for evaluation.

    Attributes:
        name: report label.
        model: the causal LM (possibly a ``PeftModel``), in eval mode.
        tokenizer: its tokenizer.
        rope: the RoPE state of the config the model runs with.
        info: JSON-ready description (references, dtype, parameters) for the report.
    """

    name: str
    model: torch.nn.Module
    tokenizer: Any
    rope: RopeState
    info: dict[str, Any] = field(default_factory=dict)

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


def pick_device(device: str | None = None) -> torch.device:
    """``cuda`` when available (unless told otherwise), else the CPU (:func:`ctxext.models.devices.resolve_device`)."""
    from ctxext.models.devices import resolve_device

    return resolve_device(device)


def load_model(
    spec: ModelSpec,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    verify: bool = True,
    calibrated: bool = True,
) -> LoadedModel:
    """Load a model for evaluation and verify its runtime RoPE.

    The evaluation defaults (SDPA, float32 on the CPU) and the report's ``info``, on top of
    :func:`ctxext.models.load.load_inference_model`.

    Args:
        spec: what to load (see :class:`ModelSpec`); a ctxext run folder as ``ref`` means its base plus
            its adapter, with the run's patched config.
        device: ``cpu`` / ``cuda`` (default: cuda when available).
        dtype: compute dtype (default float32 on the CPU, bfloat16 on a GPU).
        verify: check the runtime RoPE against the reference (raises on a mismatch).
        calibrated: run a calibrated run with its attention temperature (``ctxext calibrate`` measures without).

    Returns:
        A :class:`LoadedModel`.

    Raises:
        InputError: a missing adapter folder or an unusable run folder.
        ctxext.rope.types.RopeMismatchError: the runtime RoPE differs from the config.
    """
    from ctxext.artifacts.run import is_run_folder
    from ctxext.models.load import load_inference_model

    dev = pick_device(device)
    # A ctxext run folder as the model means its base plus its adapter, with the run's patched config.
    from_run = is_run_folder(spec.ref) and spec.adapter is None
    loaded = load_inference_model(
        None if from_run else spec.ref,
        spec.ref if from_run else spec.adapter,
        config_from=spec.config_from,
        revision=spec.revision,
        compute_dtype=dtype,
        attn_implementation="sdpa",
        device=dev,
        verify=verify,
        what=f"evaluating {spec.ref}",
        calibrated=calibrated,
    )
    model: torch.nn.Module = loaded.model
    tokenizer = loaded.tokenizer
    rope = read_rope(_base(model).config)
    check = loaded.rope_check
    n_params = sum(p.numel() for p in model.parameters())
    info = {
        "name": spec.label(),
        "ref": spec.ref,
        "base": loaded.base,
        "base_path": str(loaded.base_path),
        "adapter": str(loaded.adapter_dir) if loaded.adapter_dir else None,
        "config_from": loaded.config_from,
        "dtype": str(loaded.compute_dtype).replace("torch.", ""),
        "device": str(dev),
        "attention": "sdpa",
        "parameters": n_params,
        "rope_verified": bool(check and check.ok),
        "attention_temperature": loaded.attention_temperature,
    }
    return LoadedModel(name=spec.label(), model=model, tokenizer=tokenizer, rope=rope, info=info)


def _base(model: torch.nn.Module) -> PreTrainedModel:
    # A PeftModel wraps the transformers model; RoPE and config live on the latter.
    getter = getattr(model, "get_base_model", None)
    return cast("PreTrainedModel", getter() if callable(getter) else model)


def base_model(model: torch.nn.Module) -> PreTrainedModel:
    """The transformers model under a peft wrapper (or the model itself)."""
    return _base(model)


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
