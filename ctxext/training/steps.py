"""What one optimizer step is made of: the model wrapper with the chunked loss, the data order, the optimizer.

The data order is a pure function of (seed, epoch), so a resumed run skips exactly the micro-batches
already consumed.

Mixed context-window training (LongRoPE2, Shang et al. 2025): under a length-dependent RoPE (``longrope``,
``dynamic``) transformers picks the frequencies of a forward pass from the largest position id of the whole
micro-batch, so a short row batched with a long one would run the long-context frequencies, unlike the
same row served alone. Rows whose positions stay within the original window therefore go into micro-batches
of their own (:func:`micro_batches` with ``short``), and the wrapper returns the rotary modules to their
short state before every forward (dynamic NTK otherwise keeps the frequencies of the longest pass it saw).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ctxext.errors import InputError
from ctxext.models.load import base_model
from ctxext.recipe.schema import Recipe
from ctxext.rope.runtime import reset_dynamic_rope, rotary_modules
from ctxext.training.losses import chunked_cross_entropy


class CausalLMWithChunkedLoss(torch.nn.Module):
    """Wraps a peft causal LM (in a full fine-tune, the causal LM) so that its forward returns the chunked loss.

    The wrapper is what accelerate prepares (DDP / FSDP / DeepSpeed): the loss has to be computed inside the
    wrapped module's forward for gradient synchronisation to see it. The attribute keeps its name in both modes:
    checkpoints store the weights under ``peft_model.``.
    """

    def __init__(self, peft_model: Any, chunk_size: int):
        super().__init__()
        self.peft_model = peft_model
        self.chunk_size = chunk_size
        self.reset_rope = short_window(peft_model) is not None
        # What FSDP2's transformer wrap policy shards one by one (accelerate reads it from the prepared module): the
        # decoder layers; without it the whole model would be one group, gathered whole for every forward.
        self._no_split_modules = list(getattr(base_model(peft_model), "_no_split_modules", None) or [])

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed next-token loss and the number of scored tokens (``labels`` are already shifted).

        ``position_ids`` / ``attention_mask`` come from :func:`ctxext.training.data.rows.build_inputs` (PoSE, packed
        documents); ``None`` is the model's default causal path.
        """
        base = base_model(self.peft_model)
        if self.reset_rope:
            # Here, inside the prepared module: DDP broadcasts rank 0's buffers (inv_freq) as its forward starts.
            reset_dynamic_rope(base)
        hidden = base.base_model(
            input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        head = base.get_output_embeddings()
        total = chunked_cross_entropy(
            hidden, head.weight, labels, bias=head.bias, chunk_size=self.chunk_size, reduction="sum"
        )
        return total, (labels != -100).sum()


def short_window(model: torch.nn.Module) -> int | None:
    """The window within which a length-dependent RoPE runs its short regime, or ``None`` for a static one.

    transformers 5.24 decides per forward from ``max(position_ids) + 1``: ``longrope`` uses its short factors
    up to ``original_max_position_embeddings``, ``dynamic`` its unscaled frequencies up to the original
    ``max_position_embeddings``.
    """
    for _, module in rotary_modules(model):
        rope_type = getattr(module, "rope_type", None)
        # Attributes of transformers' rotary module (typed here as Any: nn.Module types them as Tensor | Module).
        config: Any = getattr(module, "config", None)
        if rope_type == "longrope":
            return int(config.rope_parameters["original_max_position_embeddings"])
        if rope_type == "dynamic":
            return int(getattr(module, "original_max_seq_len"))  # noqa: B009
    return None


def short_rows(train: Any, model: torch.nn.Module) -> list[bool] | None:
    """Per training row, whether it stays within the short RoPE regime; ``None`` for a static RoPE.

    Args:
        train: the training rows (a ``datasets.Dataset`` in torch format).
        model: the model (its rotary modules say whether the RoPE is length-dependent).
    """
    from ctxext.training.data.rows import row_reach

    window = short_window(model)
    if window is None:
        return None
    reach = [row_reach(train[i : i + 1024]) for i in range(0, len(train), 1024)]
    return (torch.cat(reach) < window).tolist()


def micro_batches(
    n_blocks: int,
    micro_batch_size: int,
    world: int,
    rank: int,
    seed: int,
    start: int = 0,
    short: list[bool] | None = None,
) -> Iterator[list[int]]:
    """The block indices of this process's micro-batches, forever, from micro-batch number ``start``.

    Epoch ``e`` visits the blocks in ``randperm(seed + e)`` order; global micro-batch ``k`` of an
    epoch goes to process ``k % world``. The order depends on nothing else, so skipping ``start``
    micro-batches on resume is exact.

    With ``short`` (one flag per block) holding both kinds, no micro-batch mixes them: each epoch cuts
    the short and the long blocks, each in ``randperm(seed + e)`` order, into micro-batches, then shuffles
    the micro-batches with the same generator. A group's last partial micro-batch waits for a later
    epoch (like the tail of the plain order).

    Args:
        n_blocks: training blocks.
        micro_batch_size: blocks per micro-batch.
        world: data-parallel processes.
        rank: this process's data-parallel rank.
        seed: the recipe seed.
        start: micro-batches of this process already consumed.
        short: per block, whether it runs the short RoPE regime (:func:`short_window`), or ``None``.

    Yields:
        Lists of ``micro_batch_size`` block indices.
    """
    # Only both kinds need keeping apart; a run of one kind keeps the plain order.
    grouped = short if short is not None and 0 < sum(short) < n_blocks else None
    if grouped is not None:
        n_batches = sum(n // micro_batch_size for n in (sum(grouped), n_blocks - sum(grouped)))
    else:
        n_batches = n_blocks // micro_batch_size
    per_epoch = n_batches // world
    if per_epoch == 0:
        raise InputError(
            f"data: {n_blocks} training blocks cannot fill one micro-batch of {micro_batch_size} on each of "
            f"{world} processes; add data or lower train.micro_batch_size / train.seq_len"
            + ("" if grouped is None else " (short and long rows go into separate micro-batches)")
        )
    k = start
    epoch, order = -1, []
    while True:
        e, i = divmod(k, per_epoch)
        if e != epoch:
            epoch = e
            gen = torch.Generator().manual_seed(seed + e)
            perm = torch.randperm(n_blocks, generator=gen).tolist()
            if grouped is not None:
                order = _grouped(perm, grouped, micro_batch_size, gen)
            else:
                order = [
                    perm[j : j + micro_batch_size] for j in range(0, n_batches * micro_batch_size, micro_batch_size)
                ]
        yield order[i * world + rank]
        k += 1


def _grouped(perm: list[int], short: list[bool], size: int, gen: torch.Generator) -> list[list[int]]:
    """Micro-batches of only short or only long blocks (each group in ``perm`` order), in a shuffled order."""
    batches = []
    for flag in (True, False):
        group = [i for i in perm if short[i] == flag]
        batches += [group[j : j + size] for j in range(0, len(group) - size + 1, size)]
    return [batches[j] for j in torch.randperm(len(batches), generator=gen).tolist()]


def make_optimizer(recipe: Recipe, params: list[torch.nn.Parameter], device: torch.device) -> tuple[Any, str]:
    """The recipe's optimizer over ``params`` and its name (``auto``: paged 8-bit AdamW for CUDA adapters, else AdamW).

    Raises:
        InputError: ``paged_adamw_8bit`` without CUDA.
    """
    name = recipe.train.optimizer
    if name == "auto":
        # A full fine-tune keeps fp32 AdamW moments (and ZeRO-3 / FSDP2 shard them); adapters page 8-bit ones.
        name = "paged_adamw_8bit" if device.type == "cuda" and recipe.train.mode != "full" else "adamw"
    kwargs: dict[str, Any] = {"lr": recipe.train.learning_rate, "weight_decay": recipe.train.weight_decay}
    if name == "paged_adamw_8bit":
        if device.type != "cuda":
            raise InputError("train.optimizer: paged_adamw_8bit pages optimizer state through CUDA; use adamw on CPU")
        import bitsandbytes as bnb

        return bnb.optim.PagedAdamW8bit(params, **kwargs), name
    return torch.optim.AdamW(params, **kwargs), name


def make_scheduler(recipe: Recipe, optimizer: Any) -> Any:
    """The learning-rate schedule: warmup, then the recipe's decay over ``train.max_steps``."""
    from transformers import get_scheduler

    cfg = recipe.train
    return get_scheduler(
        {"constant": "constant_with_warmup"}.get(cfg.scheduler, cfg.scheduler),
        optimizer,
        num_warmup_steps=cfg.warmup_steps,
        num_training_steps=cfg.max_steps,
    )


def peak_mem_mb(device: torch.device) -> float:
    """Peak memory of this process in MiB: allocated CUDA memory, or the peak resident memory on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    # The process's peak resident memory (Linux reports KiB).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
