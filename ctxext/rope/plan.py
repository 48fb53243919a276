"""Planning an extension, checking its intent, writing it into a config.

A method of the registry (:mod:`ctxext.rope.methods`) turns (state, target, options) into standard
``rope_parameters`` + ``max_position_embeddings`` that vanilla transformers loads; the plan's intent is checked,
then written into a config.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ctxext.rope.methods import METHODS, get_method
from ctxext.rope.read import read_rope, text_config
from ctxext.rope.scaling_types import SCALING_TYPES, check_rope_parameters, reference_rope
from ctxext.rope.types import RopeConfigError, RopeError, RopeMismatchError, RopePlan, RopeState

RELATIVE_TO = ("original", "current")
# The longest target ctxext plans: 2^27 tokens (134M), beyond every context a model has been trained for; far
# larger numbers overflow the integer types the RoPE and config code use.
MAX_TARGET_LENGTH = 1 << 27


def describe_extension(state: RopeState) -> str | None:
    """What the model already is, if it is extended (a ctxext extension, or a scaled rope type); else ``None``."""
    meta = state.extension
    if meta.get("method"):
        base_theta = (meta.get("base_rope_parameters") or {}).get("rope_theta")
        theta = (
            f", rope_theta {base_theta:g} → {state.rope_theta:g}"
            if base_theta and base_theta != state.rope_theta
            else ""
        )
        return f"extended by ctxext with {meta['method']} from {state.original_length} to {state.current_length}{theta}"
    if state.rope_type != "default":
        return (
            f"already scaled: {state.rope_type} ×{state.factor:g} ({state.original_length} → {state.current_length} "
            "tokens), and was most likely trained with it"
        )
    return None


def _base_state(state: RopeState) -> RopeState:
    # The unscaled RoPE an extension started from: ctxext's record, or the scaled config without its scaling.
    base = dict(state.extension.get("base_rope_parameters") or {})
    if base.get("rope_type", "default") != "default":
        return _base_state(replace(state, rope_type=base["rope_type"], parameters=base, extension={}))
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": float(base.get("rope_theta", state.rope_theta))}
    prf = base.get("partial_rotary_factor", state.parameters.get("partial_rotary_factor"))
    if prf is not None:
        params["partial_rotary_factor"] = prf
    return replace(
        state,
        rope_type="default",
        rope_theta=params["rope_theta"],
        parameters=params,
        current_length=state.original_length,
    )


def _changes(old: RopeState, plan: RopePlan) -> str:
    # What replacing an existing scaling changes, measured at the target length.
    seq = plan.target_length
    old_f, old_att = reference_rope(old.parameters, old.rotary_dim, old.max_position_embeddings, seq)
    new_f, new_att = reference_rope(plan.rope_parameters, plan.rotary_dim, plan.max_position_embeddings, seq)
    moved = int(((new_f - old_f).abs() / old_f > 0.01).sum())
    text = f"{moved} of {old.rotary_dim // 2} rotary frequencies change by more than 1 %"
    if not math.isclose(old_att, new_att, rel_tol=1e-6):
        text += f", and the attention scaling goes from {old_att:.4g} to {new_att:.4g}"
    return text


def plan_extension(
    config: Any,
    method: str,
    target_length: int,
    options: dict[str, Any] | None = None,
    original_length: int | None = None,
    relative_to: str | None = None,
) -> RopePlan:
    """Compute the RoPE settings that extend ``config`` to ``target_length`` with ``method``.

    For an unscaled model the factor is ``target_length / original_length``. A model that is already
    extended (by ctxext, or a scaled config such as Llama 3.1's llama3 ×8) is never scaled twice
    silently: ``relative_to`` must say how to compose, otherwise a :class:`RopeError` explains both
    choices.

    - ``"original"``: replace the existing extension. Start from the unscaled base RoPE (ctxext's
      record of the base ``rope_theta``, or the config without its scaling) and scale from the
      pretraining length. The plan's notes say what changes for the model (frequencies, attention
      temperature).
    - ``"current"``: stack on the current state. The model as it is (its ``rope_theta``, its context)
      is treated as the new base, and the factor is ``target / current``. Only unscaled (e.g. NTK- or
      theta-extended) models and linear-on-linear compose this way; transformers holds one scaling per
      model, so other combinations are refused.

    Args:
        config: the model's config (not modified).
        method: a name in :data:`METHODS`.
        target_length: the new context length.
        options: method options, as the method declares them (``beta_fast``, ``low_freq_factor``, ``rope_theta``,
            ``factors_file`` …); ``None`` values count as not given.
        original_length: overrides the pretraining length read from the config.
        relative_to: ``None``, ``"original"`` or ``"current"`` (see above).

    Returns:
        The :class:`RopePlan`.

    Raises:
        RopeError: unknown method, unknown option, a target not above the current context, bad values,
            or an already-extended model without ``relative_to``.
    """
    if isinstance(target_length, bool) or not 0 < int(target_length) <= MAX_TARGET_LENGTH:
        raise RopeError(
            f"--target-length {target_length}: must be a number of tokens between 1 and {MAX_TARGET_LENGTH:,} "
            "(rope.target_length in a recipe)"
        )
    spec = get_method(method)
    if relative_to is not None and relative_to not in RELATIVE_TO:
        raise RopeError(f"--relative-to {relative_to!r}: choose one of {', '.join(RELATIVE_TO)}")
    values = spec.resolve(options or {})  # the declared options: given (converted, checked) or default
    current = read_rope(config, original_length=original_length)
    check_rope_parameters(current.parameters, current.rotary_dim, current.max_position_embeddings)
    if target_length <= current.current_length:
        raise RopeError(
            f"target length {target_length} is not above the model's current context ({current.current_length}); "
            f"choose a target longer than {current.current_length} (the model's original length is "
            f"{current.original_length})."
        )
    existing = describe_extension(current)
    state, composed_on = current, {}
    if existing and relative_to is None:
        raise RopeError(
            f"this model is {existing}. Extending it again must not scale it twice by accident; say how to compose "
            "(`ctxext extend --relative-to original|current`; in a recipe, rope.relative_to: original|current):\n"
            f"  original: replace that extension: {method} from the unscaled base RoPE, "
            f"{current.original_length} → {target_length} (×{target_length / current.original_length:g});\n"
            f"  current: keep it and stack {method} on top, {current.current_length} → {target_length} "
            f"(×{target_length / current.current_length:g}); possible for NTK/theta-extended models and linear on "
            "linear only."
        )
    if existing and relative_to == "original":
        state = _base_state(current)
    elif existing and relative_to == "current":
        composable = current.rope_type == "default" or (current.rope_type == method == "linear")
        if not composable:
            raise RopeError(
                f"relative_to current: {method} cannot be stacked on {current.rope_type} scaling; transformers "
                "holds one RoPE scaling per model. Replace it instead (`ctxext extend --relative-to original`; in a "
                "recipe, rope.relative_to: original)."
            )
        composed_on = dict(current.extension) or {"rope_parameters": dict(current.parameters)}
        if current.rope_type == "linear":
            # Linear on linear is one linear scaling by the product of the factors: relative to the original.
            state = _base_state(current)
        else:
            params = {
                k: v for k, v in current.parameters.items() if k in ("rope_type", "rope_theta", "partial_rotary_factor")
            }
            state = replace(current, original_length=current.current_length, parameters=params, extension={})
    s = target_length / state.original_length
    plan = spec.plan(state, target_length, s, values)
    plan.composed_on = composed_on
    check_rope_parameters(plan.rope_parameters, state.rotary_dim, plan.max_position_embeddings)
    if (
        plan.rope_parameters["rope_type"] not in ("default", "dynamic")
        and plan.original_length >= plan.max_position_embeddings
    ):
        raise RopeConfigError(
            {
                "original_max_position_embeddings": (
                    f"original length {plan.original_length} ≥ new max {plan.max_position_embeddings}"
                )
            }
        )
    check_plan_intent(plan)
    if existing:
        plan.notes.append(f"the model was {existing}; {_changes(current, plan)} (relative to {relative_to})")
    return plan


def check_plan_intent(plan: RopePlan) -> None:
    """Check that a plan's ``rope_parameters`` express its intent: method, factor, original and target length.

    The plan's parameters come from the method's builder; this re-derives what they must say from the
    plan's own numbers (``factor = target / original`` and the method's defining relation), so a builder
    that writes something else cannot produce a "verified" model.

    Args:
        plan: from :func:`plan_extension`.

    Raises:
        RopeMismatchError: naming the first disagreement.
    """
    p, s = plan.rope_parameters, plan.factor
    problems = []
    if not math.isclose(s, plan.target_length / plan.original_length, rel_tol=1e-9):
        problems.append(f"factor {s:g} is not target/original = {plan.target_length}/{plan.original_length}")
    spec = SCALING_TYPES.get(str(p.get("rope_type")))
    if spec is not None:
        problems += spec.plan_problems(plan)
    if plan.method in METHODS:
        problems += METHODS[plan.method].intent_problems(plan)
    if problems:
        raise RopeMismatchError(f"the {plan.method} plan does not match its intent: " + "; ".join(problems))


def apply_plan(config: Any, plan: RopePlan) -> None:
    """Write a plan into a config in place (standard fields, plus ``config.ctxext`` metadata).

    Args:
        config: the config to modify.
        plan: from :func:`plan_extension`.
    """
    text = text_config(config)
    text.rope_parameters = dict(plan.rope_parameters)
    text.max_position_embeddings = plan.max_position_embeddings
    # Phi-3 style configs keep the pretraining length at top level, and transformers prefers it.
    if getattr(text, "original_max_position_embeddings", None) is not None:
        text.original_max_position_embeddings = plan.original_length
    text.ctxext = {
        "method": plan.method,
        "original_length": plan.original_length,
        "target_length": plan.target_length,
        "factor": plan.factor,
        # The RoPE the extension started from: re-extending restarts from it (--relative-to original).
        "base_rope_parameters": dict(plan.base_parameters),
    }
    if plan.composed_on:
        text.ctxext["composed_on"] = dict(plan.composed_on)


def legacy_fields(rope_parameters: dict[str, Any]) -> dict[str, Any]:
    """The pre-transformers-5 form of ``rope_parameters``, for older consumers.

    Args:
        rope_parameters: standard parameters.

    Returns:
        ``{"rope_theta": ..., "rope_scaling": {...}, "partial_rotary_factor": ...}``; ``rope_scaling``
        carries every RoPE key, with both ``type`` and ``rope_type`` because readers disagree on the key
        (transformers#32916).
    """
    # transformers 5 reads ``rope_scaling`` as an alias of ``rope_parameters``: a ``rope_scaling`` that
    # lacks a key (partial_rotary_factor, rope_theta) makes it fall back to the class default on reload
    # (a Phi model's 0.4 became 0.5). So every key is written in both places, and at top level too.
    scaling = dict(rope_parameters)
    scaling["type"] = scaling.get("rope_type", "default")
    # Unscaled RoPE has no rope_scaling in the old format (transformers < 4.43 rejects type "default").
    unscaled = scaling["type"] == "default"
    out: dict[str, Any] = {"rope_theta": rope_parameters["rope_theta"], "rope_scaling": None if unscaled else scaling}
    if rope_parameters.get("partial_rotary_factor") is not None:
        out["partial_rotary_factor"] = rope_parameters["partial_rotary_factor"]
    return out
