"""What ``ctxext train`` refuses before it loads a weight, as one function that ``ctxext validate`` runs too.

A recipe that validates must not be refused by ``train`` for a reason that was knowable from the recipe, the
model's config and this machine: a tracker that is not installed, a CUDA-only setting on a machine without CUDA,
LoRA modules the model does not have (checked on a weightless copy of the model built from its config), a
built-in data source read in a field it does not have. Problems that need the data read (too few documents)
or the weights loaded (out of memory) are found only by training.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ctxext.errors import InputError
from ctxext.recipe.schema import Recipe, RecipeError

# train.tracker → the module it needs.
_TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb"}


def preflight_problems(recipe: Recipe, config: Any = None, model: bool = True) -> list[tuple[str, str]]:
    """Every problem ``train`` would refuse the recipe for before loading weights, as ``(key, message)``.

    Args:
        recipe: a validated recipe.
        config: the model's config when the caller has read it (``None``: read here from a local folder or a
            built-in; a Hub model is not fetched, and its LoRA modules are then not checked).
        model: check the LoRA modules against the model (``False``: the recipe and this machine only).
    """
    import torch

    problems: list[tuple[str, str]] = []
    cuda = torch.cuda.is_available()
    cfg = recipe.train
    module = _TRACKERS.get(cfg.tracker)
    if module and importlib.util.find_spec(module) is None:
        problems.append(("train.tracker", f"{cfg.tracker} is not installed; pip install {module}"))
    if cfg.optimizer == "paged_adamw_8bit" and not cuda:
        problems.append(("train.optimizer", "paged_adamw_8bit pages optimizer state through CUDA; use adamw on CPU"))
    from ctxext.models.build import attention_for

    try:
        attention_for(recipe.model.attn_implementation, torch.device("cuda" if cuda else "cpu"))
    except InputError as exc:
        key, _, message = str(exc).partition(": ")
        problems.append((key, message))
    problems += _recipe_problems(recipe)
    problems += _data_problems(recipe)
    if model:
        config = config if config is not None else _local_config(recipe)
        problems += _lora_problems(recipe, config)
    problems += _split_problems(recipe, config if model else None, cuda)
    return problems


def check_preflight(recipe: Recipe, source: str = "recipe") -> None:
    """Raise :class:`~ctxext.recipe.schema.RecipeError` with every :func:`preflight_problems` (``train``'s start)."""
    problems = preflight_problems(recipe)
    if problems:
        raise RecipeError(source, problems)


def _recipe_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """Settings that exclude each other, found by the data preparation or the loop once the model is loaded."""
    data, cfg = recipe.data, recipe.train
    problems = []
    if cfg.context_parallel_size > 1 and (cfg.pose or data.document_mask or data.short_fraction):
        problems.append(("train.context_parallel_size", "PoSE, data.document_mask and data.short_fraction need 1"))
    if data.short_fraction > 0 and recipe.rope.method == "none":
        problems.append(("data.short_fraction", "needs the model's original length; set a rope method"))
    if not data.packing and data.min_tokens is not None and data.min_tokens < recipe.seq_len:
        problems.append(
            (
                "data.min_tokens",
                f"{data.min_tokens} is below train.seq_len ({recipe.seq_len}); without packing every example must "
                "fill a whole block (set data.min_tokens >= train.seq_len or turn packing on)",
            )
        )
    return problems


def _split_problems(recipe: Recipe, config: Any, cuda: bool) -> list[tuple[str, str]]:
    """A head split no engine serves, or a ring this machine or model cannot run (the rules ``train`` applies)."""
    import torch

    from ctxext.models.build import attention_for
    from ctxext.training.sequence_parallel import KEY, RING_KEY, check_heads, ring_refusal

    cfg, problems = recipe.train, []
    if cfg.sequence_parallel_size > 1 and config is not None:
        try:
            check_heads(config, cfg.sequence_parallel_size)
        except InputError as exc:
            problems.append((KEY, str(exc).removeprefix(f"{KEY}: ")))
    if cfg.context_parallel_size > 1:
        try:
            attn = attention_for(recipe.model.attn_implementation, torch.device("cuda" if cuda else "cpu"))
        except InputError:
            attn = "sdpa"  # reported above, under model.attn_implementation
        refusal = ring_refusal(config, attn, cuda)
        if refusal:
            problems.append((RING_KEY, f"{cfg.context_parallel_size}: {refusal}"))
    return problems


def _data_problems(recipe: Recipe) -> list[tuple[str, str]]:
    from ctxext.models.data_sources import is_stdlib
    from ctxext.training.data.corpus import stdlib_problem

    data = recipe.data
    sources = [("data", data.path, data.text_field)] + [
        (f"data.mixture[{i}]", s.path, s.text_field) for i, s in enumerate(data.mixture or []) if s.path
    ]
    problems = []
    for key, path, field in sources:
        problem = stdlib_problem(path, field) if path and is_stdlib(path) else None
        if problem:
            problems.append((f"{key}.{problem[0]}", problem[1]))
    return problems


def _lora_problems(recipe: Recipe, config: Any) -> list[tuple[str, str]]:
    """LoRA modules checked on the model built from its config on the meta device (no memory, no weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ctxext.training.model import lora_module_problems

    if config is None:
        return []
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=recipe.model.trust_remote_code)
    except Exception:  # an architecture transformers cannot build from the config alone: training finds out
        return []
    return lora_module_problems(model, recipe.lora)


def _local_config(recipe: Recipe) -> Any:
    from pathlib import Path

    from ctxext.models.builtin import BUILTIN_PREFIX
    from ctxext.models.gguf import split_gguf_ref
    from ctxext.models.sources import load_config

    path = recipe.model.path
    local = path.startswith(BUILTIN_PREFIX) or Path(path).expanduser().is_dir()
    try:
        local = local or split_gguf_ref(path) is not None  # a GGUF file: its converted folder (once per file)
    except InputError:
        return None
    if not local:
        return None
    try:
        config, _ = load_config(path, recipe.model.revision)
    except InputError:
        return None  # train's own loading names the problem
    return config
