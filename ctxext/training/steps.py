"""What one optimizer step is made of: the model wrapper with the chunked loss, the data order, the optimizer.

The data order is a pure function of (seed, epoch), so a resumed run skips exactly the micro-batches
already consumed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ctxext.errors import InputError
from ctxext.recipe.schema import Recipe
from ctxext.training.losses import chunked_cross_entropy


class CausalLMWithChunkedLoss(torch.nn.Module):
    """Wraps a peft causal LM so that its forward returns the chunked loss, not logits.

    The wrapper is what accelerate prepares (DDP / FSDP): the loss has to be computed inside the
    wrapped module's forward for gradient synchronisation to see it.
    """

    def __init__(self, peft_model: Any, chunk_size: int):
        super().__init__()
        self.peft_model = peft_model
        self.chunk_size = chunk_size

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
        base = self.peft_model.get_base_model()
        hidden = base.base_model(
            input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        head = base.get_output_embeddings()
        total = chunked_cross_entropy(
            hidden, head.weight, labels, bias=head.bias, chunk_size=self.chunk_size, reduction="sum"
        )
        return total, (labels != -100).sum()


def micro_batches(
    n_blocks: int, micro_batch_size: int, world: int, rank: int, seed: int, start: int = 0
) -> Iterator[list[int]]:
    """The block indices of this process's micro-batches, forever, from micro-batch number ``start``.

    Epoch ``e`` visits the blocks in ``randperm(seed + e)`` order; global micro-batch ``k`` of an
    epoch goes to process ``k % world``. The order depends on nothing else, so skipping ``start``
    micro-batches on resume is exact.

    Args:
        n_blocks: training blocks.
        micro_batch_size: blocks per micro-batch.
        world: data-parallel processes.
        rank: this process's data-parallel rank.
        seed: the recipe seed.
        start: micro-batches of this process already consumed.

    Yields:
        Lists of ``micro_batch_size`` block indices.
    """
    per_epoch = n_blocks // (micro_batch_size * world)
    if per_epoch == 0:
        raise InputError(
            f"data: {n_blocks} training blocks cannot fill one micro-batch of {micro_batch_size} on each of "
            f"{world} processes; add data or lower train.micro_batch_size / train.seq_len"
        )
    k = start
    epoch, perm = -1, []
    while True:
        e, i = divmod(k, per_epoch)
        if e != epoch:
            epoch = e
            perm = torch.randperm(n_blocks, generator=torch.Generator().manual_seed(seed + e)).tolist()
        first = (i * world + rank) * micro_batch_size
        yield perm[first : first + micro_batch_size]
        k += 1


def make_optimizer(recipe: Recipe, params: list[torch.nn.Parameter], device: torch.device) -> tuple[Any, str]:
    """The recipe's optimizer over ``params`` and its resolved name (``auto``: paged 8-bit AdamW on CUDA, else AdamW).

    Raises:
        InputError: ``paged_adamw_8bit`` without CUDA.
    """
    name = recipe.train.optimizer
    if name == "auto":
        name = "paged_adamw_8bit" if device.type == "cuda" else "adamw"
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
