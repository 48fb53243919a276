"""Attention temperature: every attention logit of a model multiplied by one factor ``t``.

A fine-tune extended to several times its window ends up less sharp far into the target than it could be
(the entropy growth YaRN's ``attention_factor`` and log-n scaling address); ``ctxext calibrate`` measures
whether a factor ``t > 1`` helps a run and records it (``calibration.json`` in the run folder). One factor,
two ways to carry it, the same arithmetic:

* **at run time** (:func:`set_attention_temperature`): each attention module's ``scaling`` — the
  ``1/sqrt(head_dim)`` transformers passes to every attention implementation (eager, SDPA, flash) and that
  ctxext's answer-only scoring layer uses — is multiplied by ``t``. This is what loading a calibrated run
  does (its base may be 4-bit, so the weights cannot carry it). It covers the whole head, so it is a true
  temperature for partial-rotary models too (scaling the rotary ``cos``/``sin`` would not be).
* **in the weights** (:func:`fold_attention_temperature`): the query projection multiplied by ``t``, which
  ``ctxext merge`` does, so the merged model carries it with no setting in any stack (transformers, vLLM,
  llama.cpp): RoPE rotates the query linearly, so ``(t q)·k = t (q·k)`` exactly. Where the query projection
  lives is a registry by ``model_type`` (:data:`QUERY_PROJECTIONS`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ctxext.errors import InputError

CALIBRATION_FILE = "calibration.json"
# The attribute that keeps a module's own scaling, so the temperature can be set again (not compounded).
_OWN_SCALING = "_ctxext_own_scaling"


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules whose ``scaling`` transformers passes to the attention function (one per layer).

    Args:
        model: a transformers causal LM (possibly under a peft wrapper).

    Returns:
        The attention modules, in layer order.
    """
    return [
        m
        for m in model.modules()
        if isinstance(getattr(m, "scaling", None), float) and type(m).__name__.endswith("Attention")
    ]


def set_attention_temperature(model: torch.nn.Module, t: float) -> int:
    """Multiply every attention logit by ``t`` at run time (``t`` = 1 restores the model's own scaling).

    Args:
        model: a transformers causal LM (possibly under a peft wrapper).
        t: the temperature factor (> 0).

    Returns:
        The number of attention modules set.

    Raises:
        InputError: ``t`` is not a positive number, or the model has no attention module with a ``scaling``.
    """
    check_temperature(t)
    modules = attention_modules(model)
    if not modules:
        raise InputError(
            f"{type(model).__name__}: no attention module with a 'scaling' attribute, so an attention temperature "
            "cannot be applied; calibrate only models whose transformers attention passes 'scaling'"
        )
    for m in modules:
        attention: Any = m  # duck-typed: nn.Module types every attribute as Tensor | Module
        own = getattr(attention, _OWN_SCALING, None)
        if own is None:
            own = float(attention.scaling)
            setattr(attention, _OWN_SCALING, own)
        attention.scaling = own * t
    return len(modules)


def check_temperature(t: Any, key: str = "attention temperature") -> float:
    """``t`` as a float, or an :class:`InputError` naming ``key`` when it is not a positive finite number."""
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        raise InputError(f"{key}: {t!r} is not a positive number (1.0 means no temperature)")
    return float(t)


def _scale_linear_rows(linear: torch.nn.Module, t: float, rows: slice | torch.Tensor | None = None) -> None:
    weight: Any = linear.weight
    bias: Any = getattr(linear, "bias", None)
    with torch.no_grad():
        if rows is None:
            weight.mul_(t)
            if bias is not None:
                bias.mul_(t)
        else:
            weight[rows] *= t
            if bias is not None:
                bias[rows] *= t


def _fold_q_proj(attention: torch.nn.Module, t: float) -> None:
    # Llama-structured attention: a separate query projection.
    _scale_linear_rows(attention.get_submodule("q_proj"), t)


def _fold_neox(attention: torch.nn.Module, t: float) -> None:
    # GPT-NeoX fuses q, k and v: the output rows are laid out per head as [q | k | v] (head_size each).
    qkv: Any = attention.get_submodule("query_key_value")
    head_size = int(attention.head_size)  # type: ignore[arg-type]
    per_head = torch.arange(int(qkv.weight.shape[0])).view(-1, 3 * head_size)
    _scale_linear_rows(qkv, t, per_head[:, :head_size].reshape(-1))


# model_type -> how the query projection of one attention module is scaled by t. Only types whose query reaches
# the logits linearly after it: a q-norm (Qwen3, Gemma 3) would undo the factor, a fused projection (Phi-3)
# needs its own entry. Each entry is tested against the run-time temperature
# (tests/unit/calibration/test_calibration.py).
QUERY_PROJECTIONS: dict[str, Callable[[torch.nn.Module, float], None]] = {
    "llama": _fold_q_proj,
    "mistral": _fold_q_proj,
    "qwen2": _fold_q_proj,
    "gpt_neox": _fold_neox,
}


def query_projection(model_type: str) -> Callable[[torch.nn.Module, float], None]:
    """How a model type's query projection is scaled (:data:`QUERY_PROJECTIONS`).

    Raises:
        InputError: a model type ctxext does not know the query projection of.
    """
    fold = QUERY_PROJECTIONS.get(model_type)
    if fold is None:
        raise InputError(
            f"model type {model_type!r}: ctxext does not know where its query projection is, so a calibrated "
            f"attention temperature cannot be folded into the weights (known: {', '.join(sorted(QUERY_PROJECTIONS))})"
        )
    return fold


def fold_attention_temperature(model: torch.nn.Module, t: float) -> None:
    """Multiply the query projections' weights (and biases) by ``t``: the temperature carried by the weights.

    Use on full-precision weights only (a merged model); a 4-bit base is scaled at run time instead.

    Args:
        model: a transformers causal LM (not a peft wrapper).
        t: the temperature factor.

    Raises:
        InputError: a model type ctxext does not know the query projection of, or a non-positive ``t``.
    """
    check_temperature(t)
    fold = query_projection(str(getattr(getattr(model, "config", None), "model_type", "")))
    if t == 1.0:
        return
    for attention in attention_modules(model):
        fold(attention, t)


def _trained_weight_files(run_dir: str | Path) -> list[Path]:
    """The files of a run's trained weights: the adapter's, or a full fine-tune's whole model.

    Raises:
        InputError: the run has no trained weights.
    """
    from ctxext.artifacts.run import find_adapter_dir, is_full_run
    from ctxext.models.weights import weight_files

    if is_full_run(run_dir):
        files = weight_files(run_dir)
    else:
        folder = find_adapter_dir(run_dir)
        files = sorted(folder.glob("adapter_model.*")) if folder is not None else []
    if not files:
        raise InputError(f"{run_dir}: no trained weights (adapter_model.safetensors or model.safetensors) to calibrate")
    return files


def adapter_digest(run_dir: str | Path) -> str:
    """``sha256:<hex>`` of a run's trained weights: which weights a calibration was measured on.

    The adapter's weights, or a full fine-tune's whole model (its run folder is the model). The record keeps the
    key ``adapter`` for both, so records written before full fine-tunes existed still read.

    Raises:
        InputError: the run has no trained weights.
    """
    import hashlib

    digest = hashlib.sha256()
    for path in _trained_weight_files(run_dir):
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 24):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def weights_stat(run_dir: str | Path) -> list[list[Any]]:
    """``[name, size, mtime_ns]`` of each trained-weight file: what the record's digest was computed from.

    A load compares these first and hashes only when they differ: a full fine-tune's weights are the whole
    model (16 GB for an 8B model, half a minute to hash), read at every load of a calibrated run otherwise.
    Training further rewrites the files (new times), so it is still caught.

    Raises:
        InputError: the run has no trained weights.
    """
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in _trained_weight_files(run_dir)]


def read_calibration(run_dir: str | Path) -> dict[str, Any] | None:
    """A run folder's ``calibration.json`` (what ``ctxext calibrate`` chose), or ``None`` when there is none.

    Raises:
        InputError: the file exists but cannot be read, its ``attention_temperature`` is not a positive number,
            or it was measured on other adapter weights (the run trained further since).
    """
    path = Path(run_dir) / CALIBRATION_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(
            f"{path}: cannot be read ({exc}); run `ctxext calibrate {run_dir} --overwrite` again"
        ) from None
    again = f"run `ctxext calibrate {run_dir} --overwrite` again"
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a calibration record; {again}")
    t = check_temperature(data.get("attention_temperature"), f"{path}: attention_temperature")
    # A temperature chosen for other weights is no choice for these: loud, not silently applied. A record that
    # does not say which weights it was measured on cannot be checked, so it counts as stale too.
    if not isinstance(data.get("adapter"), str):
        raise InputError(f"{path}: does not record the weights it was measured on ('adapter'); {again}")
    # The same files as measured (names, sizes, times) are the same weights; otherwise hash them to be sure.
    if data.get("weights_stat") != weights_stat(run_dir) and data["adapter"] != adapter_digest(run_dir):
        raise InputError(
            f"{path}: measured on other weights than the run's now (it was trained further since); {again}"
        )
    problem = _record_problem(data, t)
    if problem:
        raise InputError(f"{path}: {problem}, so it is not what `ctxext calibrate` chose (edited by hand?); {again}")
    return data


def _record_problem(data: dict[str, Any], t: float) -> str | None:
    """Why a calibration record is not one ``ctxext calibrate`` wrote, or ``None``.

    calibrate measures every candidate (1.0 always) and chooses 1.0 or a candidate it found admissible and
    better, recording each candidate's verdicts: the choice must be one of those.
    """
    rows = data.get("candidates")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        return "its 'candidates' (the measurements) are missing or damaged"
    measured = {r.get("attention_temperature"): r for r in rows}
    if 1.0 not in measured:
        return "it has no measurement of t = 1 (the run as trained), which every calibration makes"
    row = measured.get(t)
    if row is None:
        shown = ", ".join(f"{c:g}" for c in measured if isinstance(c, (int, float)))
        return f"attention_temperature {t:g} is not one of the temperatures it measured ({shown})"
    if t != 1.0 and not (row.get("admissible") is True and row.get("better") is True):
        return f"attention_temperature {t:g} is not admissible and better in its own measurements"
    return None


def run_temperature(run_dir: str | Path | None) -> float:
    """The attention temperature a run folder was calibrated to (1.0 when it was not calibrated)."""
    if run_dir is None:
        return 1.0
    record = read_calibration(run_dir)
    return float(record["attention_temperature"]) if record else 1.0
