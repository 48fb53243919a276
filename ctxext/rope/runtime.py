"""Runtime: finding, rebuilding and verifying the rotary modules of a loaded model.

ctxext's reference (:func:`~ctxext.rope.scaling_types.reference_rope`) is compared with what the model's rotary
modules actually compute. Silently unscaled RoPE is the most reported failure in this field; this check is what
catches it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ctxext.rope.plan import apply_plan, plan_extension
from ctxext.rope.read import read_rope, text_config
from ctxext.rope.scaling_types import LENGTH_DEPENDENT_TYPES, SCALING_TYPES, check_rope_parameters, reference_rope
from ctxext.rope.types import RopeError, RopeMismatchError, RopePlan, RopeState

# Absolute and relative tolerance between ctxext's float64 reference and the runtime float32 values.
_RTOL = 1e-4


_ATOL = 1e-9


def rotary_modules(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """Yield ``(name, module)`` for every rotary embedding module of a model.

    Args:
        model: a transformers model (possibly wrapped by peft).

    Yields:
        Modules that carry an ``inv_freq`` buffer.
    """
    for name, module in model.named_modules():
        if hasattr(module, "inv_freq") and isinstance(getattr(module, "inv_freq", None), torch.Tensor):
            yield name, module


def rebuild_rotary(model: torch.nn.Module) -> int:
    """Rebuild every rotary module of a loaded model from its (patched) config.

    In transformers 5 a rotary module computes its frequencies once, in ``__init__``; changing
    ``model.config`` afterwards changes nothing at run time.

    Args:
        model: the model whose config has been patched.

    Returns:
        The number of modules rebuilt.

    Raises:
        RopeError: the model has no rotary module.
    """
    config = text_config(model.config)
    rebuilt = 0
    for name, module in list(rotary_modules(model)):
        # A tensor buffer (rotary_modules checked), which nn.Module types as Tensor | Module.
        device: torch.device = module.inv_freq.device  # type: ignore[assignment]
        try:
            fresh = type(module)(config=config, device=device)
        except TypeError:
            fresh = type(module)(config=config).to(device)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, fresh)
        rebuilt += 1
    if not rebuilt:
        raise RopeError(f"{type(model).__name__} has no rotary embedding module (no inv_freq buffer) to rebuild")
    return rebuilt


_MISSING = object()
# The config fields a RoPE setting lives in (ctxext's own record of an extension included).
_ROPE_FIELDS = ("rope_parameters", "max_position_embeddings", "original_max_position_embeddings", "ctxext")


class RopeSnapshot:
    """A loaded model's RoPE setting (its config's RoPE fields), to put back later.

    ``ctxext search`` switches one model between candidates and back to the base; the adaptive stop scores the
    base's own window with the model it trains (extended) set back to its original RoPE for a moment.

    Args:
        model: the model whose current setting is kept.
    """

    def __init__(self, model: torch.nn.Module):
        text = text_config(model.config)
        # The sentinel itself, not a deep copy of it (a copy of an object() is another object: a missing field
        # would come back as that object).
        self._saved = {name: _copied(getattr(text, name, _MISSING)) for name in _ROPE_FIELDS}

    def apply(self, model: torch.nn.Module) -> None:
        """Set ``model`` to the kept setting: its config's fields and its rotary modules (rebuilt and verified)."""
        text = text_config(model.config)
        for name, value in self._saved.items():
            if value is _MISSING:
                if hasattr(text, name):
                    delattr(text, name)
            else:
                setattr(text, name, copy.deepcopy(value))
        rebuild_rotary(model)
        verify_model_rope(model)


def _copied(value: Any) -> Any:
    return value if value is _MISSING else copy.deepcopy(value)


def reset_dynamic_rope(model: torch.nn.Module) -> None:
    """Return length-dependent rotary modules to their short-sequence state.

    transformers' dynamic NTK keeps the frequencies of the longest sequence seen so far for any
    later sequence that is still longer than the original length; an evaluator that scores several
    lengths must reset between them or its numbers depend on the order of the work.

    Args:
        model: a model with rotary modules.
    """
    for _, module in rotary_modules(model):
        original = getattr(module, "original_inv_freq", None)
        if original is not None:
            module.inv_freq = original.clone().to(module.inv_freq.device)
        if hasattr(module, "original_max_seq_len"):
            module.max_seq_len_cached = module.original_max_seq_len
        if hasattr(module, "long_inv_freq"):
            module.long_inv_freq = None  # type: ignore[assignment]  # a buffer may be None; torch's stubs say not


def _runtime_values(module: torch.nn.Module, seq_len: int) -> tuple[torch.Tensor, float]:
    # A copy, so that probing a length-dependent module at a long length leaves the model's state alone.
    probe = copy.deepcopy(module).cpu()
    x = torch.zeros(1, 1, 1, dtype=torch.float32)
    position_ids = torch.tensor([[seq_len - 1]], dtype=torch.long)
    with torch.no_grad():
        probe(x, position_ids)
    # A tensor buffer and a float attribute, which nn.Module types as Tensor | Module.
    inv_freq: torch.Tensor = probe.inv_freq  # type: ignore[assignment]
    return inv_freq.detach().double().cpu(), float(probe.attention_scaling)  # type: ignore[arg-type]


@dataclass
class RopeCheck:
    """The outcome of comparing a model's runtime RoPE with ctxext's reference.

    Attributes:
        ok: everything matched.
        checks: one entry per (module, sequence length) probed.
    """

    ok: bool
    checks: list[dict[str, Any]]

    def summary(self) -> str:
        """A one-line human summary."""
        if self.ok:
            lengths = sorted({c["seq_len"] for c in self.checks})
            return f"runtime RoPE matches the reference ({len(self.checks)} checks at lengths {lengths})"
        bad = [c for c in self.checks if not c["ok"]]
        first = bad[0]
        return (
            f"runtime RoPE of {first['module'] or 'model'} at length {first['seq_len']} differs from the "
            f"reference: max relative inv_freq error {first['max_rel_error']:.3g}, attention scaling "
            f"{first['runtime_attention_scaling']:.6g} vs {first['reference_attention_scaling']:.6g}"
        )


def probe_lengths(state: RopeState) -> list[int]:
    """The sequence lengths at which the runtime RoPE is compared with the reference.

    Args:
        state: the config's RoPE.

    Returns:
        For length-dependent types, a length within the original context and the current one;
        otherwise the current context only.
    """
    if state.rope_type in LENGTH_DEPENDENT_TYPES:
        return sorted({min(state.original_length, state.current_length), state.current_length})
    return [state.current_length]


def check_model_rope(model: torch.nn.Module, lengths: list[int] | None = None) -> RopeCheck:
    """Compare every rotary module's runtime ``inv_freq`` and attention scaling with the reference.

    Args:
        model: a loaded (or meta-built then rebuilt) model.
        lengths: sequence lengths to probe; defaults to :func:`probe_lengths`.

    Returns:
        A :class:`RopeCheck`.
    """
    config = text_config(model.config)
    state = read_rope(config)
    checks: list[dict[str, Any]] = []
    modules = list(rotary_modules(model))
    if not modules:
        raise RopeError(f"{type(model).__name__} has no rotary embedding module (no inv_freq buffer)")
    for seq_len in lengths or probe_lengths(state):
        ref_freq, ref_scale = reference_rope(state.parameters, state.rotary_dim, state.max_position_embeddings, seq_len)
        for name, module in modules:
            run_freq, run_scale = _runtime_values(module, seq_len)
            if run_freq.shape != ref_freq.shape:
                rel = float("inf")
            else:
                rel = float(((run_freq - ref_freq).abs() / (ref_freq.abs() + _ATOL)).max())
            scale_ok = math.isclose(run_scale, ref_scale, rel_tol=_RTOL)
            checks.append(
                {
                    "module": name,
                    "seq_len": seq_len,
                    "max_rel_error": rel,
                    "runtime_attention_scaling": run_scale,
                    "reference_attention_scaling": ref_scale,
                    "ok": rel <= _RTOL and scale_ok,
                }
            )
    return RopeCheck(ok=all(c["ok"] for c in checks), checks=checks)


def verify_model_rope(model: torch.nn.Module, lengths: list[int] | None = None) -> RopeCheck:
    """Like :func:`check_model_rope`, but raise on a mismatch.

    Args:
        model: the model to verify.
        lengths: sequence lengths to probe.

    Returns:
        The passing :class:`RopeCheck`.

    Raises:
        RopeMismatchError: the runtime RoPE differs from the config's reference.
    """
    state = read_rope(model.config)
    check_rope_parameters(state.parameters, state.rotary_dim, state.max_position_embeddings)
    result = check_model_rope(model, lengths)
    if not result.ok:
        raise RopeMismatchError(
            result.summary()
            + ". The model would silently run with the wrong positions. If you changed model.config after loading, "
            "call ctxext.rope.runtime.rebuild_rotary(model); if the model uses custom modeling code, it may ignore "
            "rope_parameters."
        )
    return result


def patch_model(  # the parameters after ``model`` are plan_extension's, forwarded unchanged
    model: torch.nn.Module,
    method: str,
    target_length: int,
    options: dict[str, Any] | None = None,
    original_length: int | None = None,
    relative_to: str | None = None,
) -> RopePlan:
    """Extend a loaded model in place: patch its config, rebuild its rotary modules, verify.

    Args:
        model: a transformers causal LM.
        method: a name in :data:`METHODS`.
        target_length: the new context length.
        options: method options.
        original_length: overrides the pretraining length.
        relative_to: how to compose with an existing extension (see :func:`plan_extension`).

    Returns:
        The applied :class:`RopePlan`.
    """
    plan = plan_extension(model.config, method, target_length, options, original_length, relative_to)
    apply_plan(model.config, plan)
    rebuild_rotary(model)
    verify_model_rope(model)
    return plan


def _phase_tolerance(position: int) -> float:
    # transformers computes position × inv_freq in float32: a relative error of a few ulp on a phase
    # of up to ``position`` radians. A wrong factor or base moves phases by O(1) long before that.
    return 1e-5 + 1e-6 * position


def probe_positions(original_length: int, target_length: int) -> list[int]:
    """Positions whose cos/sin are checked: 0, the last original position and the last target position."""
    return sorted({0, max(original_length - 1, 0), max(target_length - 1, 0)})


def check_cos_sin(
    model: torch.nn.Module,
    rope_parameters: dict[str, Any],
    rotary_dim: int,
    max_position_embeddings: int,
    positions: list[int],
) -> RopeCheck:
    """Compare the cos/sin every rotary module hands to attention with the reference of a RoPE setting.

    Each position ``p`` is probed as the last token of a ``p + 1``-token sequence (what length-dependent
    types scale for), on a copy of the module. The reference is ``cos(p·θ_i)·a`` and ``sin(p·θ_i)·a``
    from :func:`reference_rope` of the *given* parameters, so a module that ignores its config, drops
    rotary dimensions, or computes cos/sin from something other than its ``inv_freq`` fails here.

    Args:
        model: a model with rotary modules (possibly a meta skeleton from :func:`runtime_model_from_config`).
        rope_parameters: the intended parameters (a plan's, not the model's config).
        rotary_dim: the intended rotary dimension.
        max_position_embeddings: the intended ``max_position_embeddings``.
        positions: positions to probe.

    Returns:
        A :class:`RopeCheck` with one entry per (module, position).
    """
    checks: list[dict[str, Any]] = []
    modules = list(rotary_modules(model))
    if not modules:
        raise RopeError(f"{type(model).__name__} has no rotary embedding module (no inv_freq buffer)")
    for p in positions:
        inv_freq, att = reference_rope(rope_parameters, rotary_dim, max_position_embeddings, p + 1)
        emb = torch.cat([p * inv_freq, p * inv_freq])
        ref_cos, ref_sin = torch.cos(emb) * att, torch.sin(emb) * att
        for name, module in modules:
            probe = copy.deepcopy(module).cpu()
            with torch.no_grad():
                cos, sin = probe(torch.zeros(1, 1, 1, dtype=torch.float32), torch.tensor([[p]], dtype=torch.long))
            cos, sin = cos.reshape(-1).double(), sin.reshape(-1).double()
            if cos.shape != ref_cos.shape:
                err = float("inf")
            else:
                err = float(max((cos - ref_cos).abs().max(), (sin - ref_sin).abs().max()))
            checks.append(
                {
                    "module": name,
                    "position": p,
                    "seq_len": p + 1,
                    "rotary_dim": int(cos.numel()),
                    "expected_rotary_dim": int(ref_cos.numel()),
                    "max_abs_error": err,
                    "tolerance": _phase_tolerance(p),
                    "ok": err <= _phase_tolerance(p) * max(att, 1.0),
                }
            )
    return RopeCheck(ok=all(c["ok"] for c in checks), checks=checks)


def _cos_sin_summary(check: RopeCheck) -> str:
    bad = next(c for c in check.checks if not c["ok"])
    if bad["rotary_dim"] != bad["expected_rotary_dim"]:
        return (
            f"{bad['module'] or 'the rotary module'} rotates {bad['rotary_dim']} dimensions, the plan "
            f"{bad['expected_rotary_dim']}"
        )
    return (
        f"cos/sin of {bad['module'] or 'the rotary module'} at position {bad['position']} differ from the reference "
        f"by {bad['max_abs_error']:.3g} (tolerance {bad['tolerance']:.3g})"
    )


def verify_against_plan(model: torch.nn.Module, plan: RopePlan) -> str:
    """Verify a model's runtime RoPE against a plan: ``inv_freq`` and the cos/sin at 0, L − 1, T − 1.

    Args:
        model: the model as a user will load it (reloaded from disk).
        plan: the plan it should implement.

    Returns:
        A one-line summary of what was checked.

    Raises:
        RopeMismatchError: the model does not implement the plan.
    """
    text = text_config(model.config)
    written = read_rope(text)
    if written.rotary_dim != plan.rotary_dim:
        raise RopeMismatchError(
            f"the written config rotates {written.rotary_dim} dimensions per head, the plan {plan.rotary_dim} "
            f"(partial_rotary_factor {written.parameters.get('partial_rotary_factor')!r}); the folder would load "
            "with different positions than planned"
        )
    if (written.original_length, written.current_length) != (plan.original_length, plan.target_length):
        raise RopeMismatchError(
            f"the written config reads as {written.original_length} → {written.current_length} tokens, the plan "
            f"is {plan.original_length} → {plan.target_length}"
        )
    positions = probe_positions(plan.original_length, plan.target_length)
    freq = RopeCheck(ok=True, checks=[])
    for seq_len in sorted({plan.original_length, plan.target_length}):
        ref_freq, ref_scale = reference_rope(
            plan.rope_parameters, plan.rotary_dim, plan.max_position_embeddings, seq_len
        )
        for name, module in rotary_modules(model):
            run_freq, run_scale = _runtime_values(module, seq_len)
            same = (
                run_freq.shape == ref_freq.shape
                and float(((run_freq - ref_freq).abs() / (ref_freq.abs() + _ATOL)).max()) <= _RTOL
                and math.isclose(run_scale, ref_scale, rel_tol=_RTOL)
            )
            freq.checks.append({"module": name, "seq_len": seq_len, "ok": same})
    freq.ok = all(c["ok"] for c in freq.checks)
    if not freq.ok:
        bad = next(c for c in freq.checks if not c["ok"])
        raise RopeMismatchError(
            f"the runtime inv_freq / attention scaling of {bad['module'] or 'the rotary module'} at length "
            f"{bad['seq_len']} differ from the plan ({plan.method} ×{plan.factor:g})"
        )
    cos_sin = check_cos_sin(model, plan.rope_parameters, plan.rotary_dim, plan.max_position_embeddings, positions)
    if not cos_sin.ok:
        raise RopeMismatchError(_cos_sin_summary(cos_sin) + f" (plan: {plan.method} ×{plan.factor:g})")
    return (
        f"runtime RoPE matches the plan ({plan.method} ×{plan.factor:g}): inv_freq at lengths "
        f"{sorted({plan.original_length, plan.target_length})}, cos/sin at positions {positions}"
    )


def intent_problems(state: RopeState, model: torch.nn.Module | None = None) -> dict[str, str]:
    """Disagreements between what a config states and what transformers will run.

    - the dynamic-NTK trap: ``max_position_embeddings`` above the pretraining length (ctxext's record, or
      ``--original-length`` for a third-party config), so positions up to it run unscaled (transformers starts
      dynamic scaling there);
    - a YaRN / llama3 / longrope factor that disagrees with ``max_position_embeddings / original``;
    - rotary modules whose cos/sin (at 0, L − 1, T − 1) do not match the config's reference.

    Args:
        state: from :func:`read_rope` (ctxext's ``config.ctxext`` record counts as stated intent).
        model: a model (or meta skeleton) whose rotary modules are probed; ``None`` skips that check.

    Returns:
        ``{field: problem}``; empty when config and runtime agree.
    """
    problems: dict[str, str] = {}
    if state.rope_type == "dynamic":
        # The original length as stated: ctxext's record or --original-length (read_rope puts either in the state;
        # without them it is max_position_embeddings itself, and there is nothing to compare).
        stated_original = state.original_length
        if int(stated_original) < state.max_position_embeddings:
            problems["max_position_embeddings"] = (
                f"dynamic NTK scales only beyond max_position_embeddings ({state.max_position_embeddings}), but the "
                f"original context is {stated_original}: positions {stated_original}–{state.max_position_embeddings} "
                f"run unscaled (extrapolated). Set max_position_embeddings to {stated_original}."
            )
    spec = SCALING_TYPES.get(state.rope_type)
    if spec is not None and spec.has_original and state.parameters.get("factor"):
        original = int(state.parameters["original_max_position_embeddings"])
        implied = state.factor * original
        max_pos = state.max_position_embeddings
        if max_pos > original and not math.isclose(implied, max_pos, rel_tol=0.01):
            problems["rope_parameters.factor"] = (
                f"{state.rope_type} factor {state.factor:g} scales the original {original} tokens to {implied:g}, but "
                f"max_position_embeddings says {max_pos} (factor {max_pos / original:g}); one of them is wrong. "
                f"Re-extend with `ctxext extend --target-length N --relative-to original`."
            )
    if model is not None and not problems:
        positions = probe_positions(state.original_length, state.current_length)
        try:
            check = check_cos_sin(model, state.parameters, state.rotary_dim, state.max_position_embeddings, positions)
        except RopeError as exc:
            problems["runtime"] = str(exc)
        else:
            if not check.ok:
                problems["runtime cos/sin"] = _cos_sin_summary(check) + " (reference: the config's RoPE)"
    return problems


def runtime_model_from_config(config: Any) -> torch.nn.Module:
    """Build a model's skeleton without weights, with real rotary modules, to check a config's runtime RoPE.

    The model is created on the meta device (no memory for weights); only its rotary modules are
    then rebuilt on the CPU. This is how ``ctxext inspect --config-only`` and ``ctxext extend``
    check a model without loading it.

    Args:
        config: a transformers config.

    Returns:
        A model on the meta device whose rotary modules live on the CPU.
    """
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    config_text = text_config(model.config)
    for name, module in list(rotary_modules(model)):
        try:
            fresh = type(module)(config=config_text, device=torch.device("cpu"))
        except TypeError:
            with torch.device("cpu"):
                fresh = type(module)(config=config_text)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, fresh)
    return model
