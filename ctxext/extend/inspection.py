"""``ctxext inspect``: what RoPE a model uses, and whether its runtime matches its config."""

from __future__ import annotations

from typing import Any

from ctxext.models.sources import load_config, resolve_model_path
from ctxext.rope.read import read_rope, wavelengths
from ctxext.rope.runtime import check_model_rope, intent_problems, runtime_model_from_config
from ctxext.rope.scaling_types import check_rope_parameters, reference_rope


def inspect_model(
    ref: str, config_only: bool = False, revision: str | None = None, original_length: int | None = None
) -> dict[str, Any]:
    """Describe a model's RoPE and check its runtime against ctxext's reference and the config's intent.

    ``config_problems`` lists invalid values and disagreements between what the config states and what
    transformers runs: the dynamic-NTK trap, a YaRN factor that contradicts max_position_embeddings,
    rotary modules whose cos/sin (at 0, L − 1, T − 1) are not the config's.

    Args:
        ref: local folder, Hub id or ``builtin:NAME``.
        config_only: do not load weights; the runtime check builds the model's rotary modules from
            the config on an empty (meta) model instead.
        revision: Hub revision.
        original_length: the pretraining length, when the config cannot tell it.

    Returns:
        A JSON-ready dict (the ``--json`` output).
    """
    config, _ = load_config(ref, revision)
    state = read_rope(config, original_length=original_length)
    problems: dict[str, str] = {}
    try:
        check_rope_parameters(state.parameters, state.rotary_dim, state.max_position_embeddings)
    except ValueError as exc:
        problems = getattr(exc, "problems", {"rope_parameters": str(exc)})
    waves = wavelengths(state, state.current_length)
    _, scaling = reference_rope(state.parameters, state.rotary_dim, state.max_position_embeddings, state.current_length)
    if config_only:
        model = runtime_model_from_config(config)
        loaded = "config only (rotary modules built from the config; weights not loaded)"
    else:
        from ctxext.models.build import load_weights

        # The stored dtype is kept (a bf16 checkpoint is inspected in bf16, as it would run).
        model = load_weights(resolve_model_path(ref, revision), config, compute_dtype="auto")
        loaded = "weights loaded"
    check = check_model_rope(model)
    if not problems:
        problems.update(intent_problems(state, model))
    architectures = getattr(config, "architectures", None) or [type(model).__name__]
    return {
        "model": ref,
        "architecture": architectures[0],
        "model_type": state.model_type,
        "rope_type": state.rope_type,
        "rope_theta": state.rope_theta,
        "factor": state.factor,
        "original_context": state.original_length,
        "current_context": state.current_length,
        "max_position_embeddings": state.max_position_embeddings,
        "head_dim": state.head_dim,
        "rotary_dim": state.rotary_dim,
        "attention_scaling": scaling,
        "shortest_wavelength": float(waves.min()),
        "longest_wavelength": float(waves.max()),
        "dims_longer_than_original_context": int((waves > state.original_length).sum()),
        "dims_longer_than_current_context": int((waves > state.current_length).sum()),
        "rope_parameters": state.parameters,
        "config_problems": problems,
        "notes": state.notes,
        "runtime_check": {"ok": check.ok, "summary": check.summary(), "mode": loaded, "checks": check.checks},
    }
