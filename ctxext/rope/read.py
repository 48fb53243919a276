"""Reading a model config's RoPE into a :class:`~ctxext.rope.types.RopeState`.

Accepts the transformers-5 form (``rope_parameters``) and the legacy form (``rope_theta`` + ``rope_scaling`` with
``type`` or ``rope_type``), and says what the model *is*: base theta, scaling, original and current context.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ctxext.rope.scaling_types import SCALING_TYPES, finite, reference_rope
from ctxext.rope.types import RopeConfigError, RopeError, RopeState


def text_config(config: Any) -> Any:
    """The language model's config: multimodal configs nest it, and RoPE lives there."""
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _head_dim(config: Any) -> int:
    head_dim = getattr(config, "head_dim", None)
    if head_dim:
        return int(head_dim)
    return int(config.hidden_size // config.num_attention_heads)


def normalize_rope_parameters(config: Any) -> dict[str, Any]:
    """Return the config's RoPE parameters as one flat dict with ``rope_type`` and ``rope_theta``.

    Accepts transformers-5 ``rope_parameters`` and legacy ``rope_scaling`` / ``rope_theta`` (with
    ``type`` or ``rope_type``).

    Args:
        config: a transformers ``PretrainedConfig``.

    Returns:
        A new dict; the config is not modified.

    Raises:
        RopeError: the model has no rotary position embedding, or uses per-layer RoPE settings.
    """
    config = text_config(config)
    params = getattr(config, "rope_parameters", None)
    legacy = getattr(config, "rope_scaling", None)
    theta = getattr(config, "rope_theta", None)
    if not params and not legacy and theta is None:
        model_type = getattr(config, "model_type", "this model")
        raise RopeError(
            f"{model_type} has no rotary position embedding (no rope_parameters, rope_scaling or rope_theta in "
            "its config); ctxext extends RoPE models only (Llama, Mistral, Qwen2, Gemma, Phi-3 …). A model with "
            "learned absolute positions (GPT-2, OPT) cannot be extended by rescaling RoPE."
        )
    merged: dict[str, Any] = dict(params or {})
    if legacy and legacy is not params:
        merged.update(legacy)
    if any(isinstance(v, dict) for v in merged.values()):
        raise RopeError(
            "this model sets RoPE per layer type (nested rope_parameters, e.g. Gemma 3); ctxext supports one "
            "global RoPE setting per model for now."
        )
    rope_type = merged.pop("rope_type", None) or merged.pop("type", None) or "default"
    merged.pop("type", None)
    merged["rope_type"] = rope_type
    if merged.get("rope_theta") is None:
        merged["rope_theta"] = float(theta if theta is not None else getattr(config, "default_theta", 10000.0))
    prf = getattr(config, "partial_rotary_factor", None)
    if prf is not None and "partial_rotary_factor" not in merged:
        merged["partial_rotary_factor"] = prf
    top_level_original = getattr(config, "original_max_position_embeddings", None)
    spec = SCALING_TYPES.get(rope_type)
    if spec is not None and spec.has_original and "original_max_position_embeddings" not in merged:
        merged["original_max_position_embeddings"] = int(top_level_original or config.max_position_embeddings)
    return merged


def read_rope(config: Any, original_length: int | None = None) -> RopeState:
    """Describe a config's RoPE: type, base, original and current context.

    How the original (pretraining) length is found, by rope type:

    - ``yarn``, ``llama3``, ``longrope``: ``rope_parameters.original_max_position_embeddings``; the
      current context is ``max_position_embeddings``, or ``factor × original`` when a config kept
      ``max_position_embeddings`` at the original length (Qwen2.5's documented YaRN recipe: 32768,
      factor 4 → 131072).
    - ``dynamic``: ``max_position_embeddings`` (transformers starts scaling there); the current
      context is ``factor × max_position_embeddings``.
    - ``linear``: transformers ignores ``max_position_embeddings`` here, and checkpoints disagree on
      it: LongChat-16k writes the *target* (16384, factor 8 → original 2048), Vicuna-v1.5-16k the
      *original* (4096, factor 4 → 16384). Released RoPE models were pretrained at ≥ 2048 tokens, so
      when ``max_position_embeddings / factor`` falls below 2048 while ``max_position_embeddings``
      is at least 2048, ``max_position_embeddings`` is taken as the original length; otherwise as
      the target. A note says which reading was used; ``original_length`` overrides it.
    - ``default`` (incl. raised theta, e.g. Code Llama): ``max_position_embeddings``.

    A folder written by ``ctxext extend`` records both lengths under ``config.ctxext``, which wins.

    Args:
        config: a transformers ``PretrainedConfig``.
        original_length: overrides the pretraining length when the config cannot tell it.

    Returns:
        The :class:`RopeState`.
    """
    if original_length is not None and (isinstance(original_length, bool) or int(original_length) <= 0):
        raise RopeError(
            f"--original-length {original_length}: must be a positive number of tokens (the pretraining context)"
        )
    text = text_config(config)
    params = normalize_rope_parameters(text)
    rope_type = params["rope_type"]
    bad = {
        key: f"must be a finite number, got {value!r}"
        for key, value in (
            ("max_position_embeddings", getattr(text, "max_position_embeddings", None)),
            ("rope_parameters.rope_theta", params.get("rope_theta")),
            ("rope_parameters.factor", params.get("factor")),
            ("rope_parameters.original_max_position_embeddings", params.get("original_max_position_embeddings")),
        )
        # factor and the original length may be absent (None); the base and the context may not.
        if not finite(value) and (value is not None or key in ("max_position_embeddings", "rope_parameters.rope_theta"))
    }
    if bad:
        raise RopeConfigError(bad)
    max_pos = int(text.max_position_embeddings)
    factor = float(params.get("factor") or 1.0)
    meta = getattr(text, "ctxext", None) or {}
    notes: list[str] = []
    # Each rope type states its lengths its own way (ctxext.rope.scaling_types); an unknown type reads as default.
    spec = SCALING_TYPES.get(rope_type, SCALING_TYPES["default"])
    original, current = spec.lengths(max_pos, factor, params, notes, original_length is None and not meta)
    if isinstance(meta, dict):
        original = int(meta.get("original_length", original))
        current = int(meta.get("target_length", current))
    if original_length is not None:
        if rope_type == "linear" and not meta:
            current = int(round(original_length * factor))
        original = int(original_length)
        if rope_type == "default" and not meta:
            # Unscaled RoPE works up to its pretraining length, whatever max_position_embeddings
            # claims (Mistral 7B v0.1 says 32768 but was trained at 8192).
            current = original
    head_dim = _head_dim(text)
    rotary_dim = int(head_dim * float(params.get("partial_rotary_factor") or 1.0))
    return RopeState(
        model_type=str(getattr(text, "model_type", "unknown")),
        rope_type=rope_type,
        rope_theta=float(params["rope_theta"]),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        original_length=original,
        current_length=current,
        max_position_embeddings=max_pos,
        parameters=params,
        notes=notes,
        extension=dict(meta) if isinstance(meta, dict) else {},
    )


def wavelengths(state: RopeState, seq_len: int | None = None) -> torch.Tensor:
    """Wavelengths ``2π / inv_freq`` (in tokens) of the config's RoPE at a sequence length.

    Args:
        state: the config's RoPE.
        seq_len: length for length-dependent types.

    Returns:
        A float64 tensor of ``d/2`` wavelengths.
    """
    inv_freq, _ = reference_rope(state.parameters, state.rotary_dim, state.max_position_embeddings, seq_len)
    return 2 * math.pi / inv_freq
