"""The memory levers of ``train.memory`` (ALST, unsloth), resolved for a device and applied to a training model.

* **bf16 residual stream.** peft's k-bit preparation casts embeddings, norms and ``lm_head`` to fp32, so the
  residual stream — and every checkpointed layer input — is fp32. The weights stay fp32 here (the trained copies
  keep fp32 precision); a forward hook casts the embeddings' and norms' outputs to bf16, which halves the stream.
* **Checkpoint offload.** transformers' ``activation_checkpointing_enable(offload=True)`` holds each checkpointed
  layer input in pinned host memory (``torch.autograd.graph.save_on_cpu``): CUDA only.
* **Tiled MLP.** The gated MLP (gate/up/down) runs over sequence shards, each under its own non-reentrant
  checkpoint, so its ``tokens × intermediate`` tensors exist for one shard at a time, in the forward pass and in
  the recompute (ALST's ``TiledMLP``, written here with ``torch.utils.checkpoint`` so it runs on every device
  without importing DeepSpeed). The logits/loss are already tiled by ``ctxext/training/losses.py``.
* **Expandable segments** for the CUDA caching allocator (less fragmentation from tensors whose size varies).

Which levers a run uses is resolved by :func:`ctxext.recipe.memory.resolve_levers` (torch-free: the planner uses it
too), which refuses a lever that cannot run, naming its key (exit code 2).
"""

from __future__ import annotations

import math
import os
from functools import partial
from typing import Any

import torch

from ctxext.errors import InputError
from ctxext.recipe.memory import KEY, Levers
from ctxext.recipe.refusals import tiled_mlp_problem

ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"


def configure_allocator(enabled: bool) -> bool:
    """Turn on expandable segments for the CUDA caching allocator unless the user configured it already.

    Returns:
        Whether expandable segments are on.
    """
    if not torch.cuda.is_available():
        return False
    # torch reads PYTORCH_ALLOC_CONF (its newer name) or PYTORCH_CUDA_ALLOC_CONF: a user's setting in either wins.
    current = os.environ.get(ALLOC_ENV, "")
    for given in (os.environ.get("PYTORCH_ALLOC_CONF", ""), current):
        if "expandable_segments" in given:
            return "expandable_segments:true" in given.lower()
    if not enabled:
        return False
    # Applies to segments allocated from now on; the env var carries the setting to child processes.
    torch.cuda.memory._set_allocator_settings(EXPANDABLE)
    os.environ[ALLOC_ENV] = ",".join(filter(None, [current, EXPANDABLE]))
    return True


def _cast_output(dtype: torch.dtype, module: torch.nn.Module, args: Any, output: Any) -> Any:
    if isinstance(output, torch.Tensor) and output.is_floating_point() and output.dtype != dtype:
        return output.to(dtype)
    return output


def cast_residual_stream(model: torch.nn.Module, dtype: torch.dtype) -> list[str]:
    """Make the embeddings and every norm output ``dtype``, keeping their (fp32) weights; returns the modules.

    The hook sits on the module a decoder calls (peft's ``modules_to_save`` wrapper when the module is trained),
    so it holds in the forward pass, in the checkpoint recompute and for the trained copy alike.
    """
    names = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "embed_tokens" or leaf.endswith("norm"):
            module.register_forward_hook(partial(_cast_output, dtype))
            names.append(name)
    return names


def _tiled_forward(forward: Any, shards: int, hidden: int, x: torch.Tensor) -> torch.Tensor:
    tokens = x.shape[:-1].numel()
    n = shards or math.ceil(tokens / hidden)
    n = min(n, x.shape[-2])
    if n <= 1:
        return forward(x)
    pieces = x.tensor_split(n, dim=-2)
    if not torch.is_grad_enabled():
        return torch.cat([forward(p) for p in pieces], dim=-2)
    from torch.utils.checkpoint import checkpoint

    # Each shard saves only its input; its intermediates are rebuilt, one shard at a time, in the backward pass.
    return torch.cat([checkpoint(forward, p, use_reentrant=False) for p in pieces], dim=-2)


def tile_mlps(model: torch.nn.Module, shards: int) -> int:
    """Run every decoder layer's gated MLP over sequence shards (see the module docstring); returns how many.

    Args:
        model: the model (before or after peft wrapping).
        shards: shards per forward, or ``0`` for ceil(tokens / hidden).

    Raises:
        InputError: a model whose MLP is not the gated gate/up/down kind.
    """
    problem = tiled_mlp_problem(model)
    if problem:
        raise InputError(f"{KEY}.tiled_mlp: {problem}")
    mlps = [(n, m.mlp) for n, m in model.named_modules() if isinstance(getattr(m, "mlp", None), torch.nn.Module)]
    hidden = int(getattr(model.config, "hidden_size", 0) or 1)
    for _, mlp in mlps:
        mlp.forward = partial(_tiled_forward, type(mlp).forward.__get__(mlp), shards, hidden)
    return len(mlps)


def apply_levers(model: torch.nn.Module, levers: Levers) -> None:
    """Apply the levers that act on the (peft-wrapped) model: the residual dtype and the tiled MLP.

    Checkpoint offload is applied where checkpointing is enabled (``ctxext.training.model.add_lora``), expandable
    segments by :func:`configure_allocator`.
    """
    if levers.residual_dtype == "bf16":
        cast_residual_stream(model, torch.bfloat16)
    if levers.tiled_mlp is not None:
        tile_mlps(model, levers.tiled_mlp)
