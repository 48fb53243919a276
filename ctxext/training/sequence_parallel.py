"""Sequence parallelism: one training sequence split over ``train.sequence_parallel_size`` processes (Ulysses).

DeepSpeed's Ulysses integration for Hugging Face models (``deepspeed.runtime.sequence_parallel.ulysses_sp``,
the ALST paper, arXiv 2506.13996) replaces the model's attention function: each process embeds, projects and
rotates its own ``T/N`` tokens, an all-to-all swaps the sequence split for a head split (every process then
attends over the whole sequence with ``heads/N`` heads), and a second all-to-all swaps back. Everything outside
attention (MLP, norms, the loss) sees only ``T/N`` tokens. ctxext uses it directly under its own accelerate loop
(DDP), not through accelerate's ``ParallelismConfig(sp_backend="deepspeed")``, which shards only prepared
DataLoaders inside the DeepSpeed engine; ``docs/sequence-parallel.md`` says why.

What ctxext adds around it (:class:`SequenceSplit`):

* Every process of a sequence-parallel group reads the same rows (the data order is a pure function of the seed,
  so they agree without communication); each keeps its contiguous ``T/N`` slice. Rows are padded at the end to a
  multiple of N with ignored labels and positions that continue the row (causal attention: padding never reaches
  a real token).
* The global ``position_ids`` are always passed: RoPE rotates each shard at its true positions, so static RoPE
  methods and PoSE rows are exact. DeepSpeed gathers them and attends causally over the gathered sequence.
* The loss is the training loop's one rule (:func:`ctxext.training.losses.micro_batch_loss`): the summed token loss
  over the label *positions*. A group's rows have N × the shard's positions, and DDP averages gradients over all
  processes while a group's gradient is the *sum* of its members' (the all-to-all's backward routes each token's
  gradient to the process that owns it), so each process's share, N × shard total / (N × shard positions), is its
  shard total over its own positions: no all-reduce, and no division by a count that may be zero (a shard whose
  labels are all ignored adds 0). The result is the data-parallel mean of the per-row gradients, as without the
  split.
* Rows of several documents (``data.document_mask``, short rows, task samples) keep their documents apart. DeepSpeed
  drops every 4D mask (it would be the shard's, and quadratic in T), so the block-causal structure is rebuilt after
  the all-to-all from the gathered positions, which restart at 0 at every document start
  (:mod:`ctxext.training.data.rows`; PoSE skips never return to 0). With SDPA (:func:`segment_attention`) each
  document is attended causally on its own, so no T x T mask is ever built; flash attention's variable-length
  path in transformers cuts the row at the same restarts itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ctxext.errors import InputError
from ctxext.training.data.rows import IGNORE_INDEX, ModelInputs

KEY = "train.sequence_parallel_size"
INSTALL_HINT = "pip install 'ctxext[deepspeed]'"


@dataclass
class SequenceSplit:
    """This process's share of a sequence; ``size == 1`` is no split (inputs and loss unchanged).

    Attributes:
        size: processes per sequence (N).
        rank: this process's place in its group (which slice it keeps).
        group: the group's ``torch.distributed`` process group (``None`` without a split).
        flatten: the attention backend takes one flattened row (flash attention: variable-length sequences are
            found from position ids that restart at 0), so the micro-batch is flattened before it is split.
    """

    size: int = 1
    rank: int = 0
    group: Any = None
    flatten: bool = False

    def shard(self, inputs: ModelInputs) -> ModelInputs:
        """This process's slice of a micro-batch: padded to a multiple of N, global positions kept.

        A row of several documents arrives with a 4D mask and positions that restart at 0 at each document: the
        mask is dropped here and rebuilt from the gathered positions after the all-to-all (module doc).
        """
        if self.size == 1:
            return inputs
        ids, labels, positions = inputs.input_ids, inputs.labels, inputs.position_ids
        if positions is None:
            positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        if self.flatten and ids.shape[0] > 1:
            ids, labels, positions = (t.reshape(1, -1) for t in (ids, labels, positions))
        pad = -ids.shape[1] % self.size
        if pad:
            ids = torch.nn.functional.pad(ids, (0, pad), value=0)
            labels = torch.nn.functional.pad(labels, (0, pad), value=IGNORE_INDEX)
            more = positions[:, -1:] + torch.arange(1, pad + 1, device=positions.device)
            positions = torch.cat([positions, more], dim=1)
        chunk = ids.shape[1] // self.size
        part = slice(chunk * self.rank, chunk * (self.rank + 1))
        ids, labels, positions = ids[:, part], labels[:, part], positions[:, part].contiguous()
        # An all-ones 2D mask keeps transformers from reading position jumps (PoSE) as packed sequences when it
        # builds the shard's mask; DeepSpeed drops that mask and attends causally over the gathered row.
        mask = None if self.flatten else torch.ones_like(ids, dtype=torch.bool)
        return ModelInputs(ids.contiguous(), labels.contiguous(), positions, mask)


def segment_attention(core: Callable[..., Any]) -> Callable[..., Any]:
    """An attention function that attends causally within each document of a row, found from its positions.

    Under the split it runs after DeepSpeed's all-to-all, on the whole gathered sequence (``heads/N`` heads) with
    the gathered ``position_ids``; DeepSpeed passes no mask. A document starts wherever a position is 0 (every row
    and every document starts there: :mod:`ctxext.training.data.rows`), the same rule as flash attention's
    variable-length path. Each document goes through ``core`` on its own, causal, so the result is the
    block-causal attention of the one-process run without a T x T mask. A row with no restart is one call.

    Args:
        core: transformers' attention function for the backend (``sdpa_attention_forward``).

    Returns:
        A function with the same signature, to register under the backend's name before DeepSpeed wraps it.
    """

    def attend(
        module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, Any]:
        positions = kwargs.get("position_ids")
        if mask is not None or positions is None or not bool((positions[:, 1:] == 0).any()):
            return core(module, query, key, value, mask, *args, **kwargs)
        rows = []
        for b in range(query.shape[0]):
            starts = sorted({0, *(positions[b] == 0).nonzero().squeeze(1).tolist()})
            pieces = []
            for s, e in zip(starts, [*starts[1:], query.shape[2]], strict=True):
                # Each document with its own positions: a core that reads them sees one document.
                own = {**kwargs, "position_ids": positions[b : b + 1, s:e]}
                pieces.append(core(module, *(t[b : b + 1, :, s:e] for t in (query, key, value)), None, *args, **own)[0])
            # transformers' attention functions return (B, T, heads, head_dim): documents join along dim 1.
            rows.append(torch.cat(pieces, dim=1))
        return torch.cat(rows, dim=0), None

    return attend


def split_rows(data: Any, first: int, n: int, micro_batch_size: int) -> tuple[dict[str, torch.Tensor], int]:
    """Rows ``first ..`` of the first ``n`` of ``data``, filled up to a whole micro-batch with row 0.

    DeepSpeed's attention is built for ``micro_batch_size`` rows, so a short last batch is filled up; the caller
    leaves the filler rows unscored.

    Returns:
        The rows and how many of them are real.
    """
    real = max(0, min(first + micro_batch_size, n) - first)
    return data[[*range(first, first + real), *[0] * (micro_batch_size - real)]], real


def check_sequence_parallel(size: int, num_processes: int) -> None:
    """Refuse a split this launch cannot make, before anything is loaded or written.

    Raises:
        InputError: DeepSpeed missing, or N not dividing the number of processes.
    """
    if size == 1:
        return
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        raise InputError(f"{KEY}: {size} needs DeepSpeed (Ulysses sequence parallelism); {INSTALL_HINT}")
    if num_processes % size:
        raise InputError(
            f"{KEY}: {size} does not divide the {num_processes} process(es) of this launch; launch a multiple of "
            f"{size} (e.g. `accelerate launch --num_processes {size} -m ctxext train ...`; on the CPU add "
            f"`--multi_gpu` and ACCELERATE_USE_CPU=true) or set {KEY}=1"
        )


def check_heads(config: Any, size: int) -> None:
    """Refuse a model whose attention heads or key/value heads N does not divide.

    Raises:
        InputError: naming both head counts and N.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    kv = int(getattr(text, "num_key_value_heads", None) or heads)
    if heads % size or kv % size:
        # Ulysses gives each process heads/N query heads and kv/N key/value heads; replicating key/value heads to
        # fill more processes is not implemented, so a model with few of them (SmolLM2: 3) splits over fewer.
        sizes = [n for n in range(1, kv + 1) if heads % n == 0 and kv % n == 0]
        raise InputError(
            f"{KEY}: {size} must divide the model's attention heads ({heads}) and key/value heads ({kv}): each "
            f"process attends with heads/N of them. Use {' or '.join(map(str, sizes))}"
        )


def start_sequence_parallel(size: int, model: Any, attn_implementation: str, micro_batch_size: int) -> SequenceSplit:
    """Install DeepSpeed's Ulysses attention for ``model`` and return this process's :class:`SequenceSplit`.

    Call it once per process, after ``torch.distributed`` is initialised (the accelerator), on every process.

    Args:
        size: processes per sequence; 1 returns ``SequenceSplit()`` and changes nothing.
        model: the (peft-wrapped) model; its config gives the head counts and attention implementation.
        attn_implementation: the model's attention implementation (``sdpa`` or a flash variant).
        micro_batch_size: rows per micro-batch.

    Raises:
        InputError: heads or key/value heads not divisible by N.
    """
    if size == 1:
        return SequenceSplit()
    check_heads(model.config, size)
    if not torch.cuda.is_available():
        # DeepSpeed picks its accelerator once, at import; on a machine without CUDA it must be the CPU one.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import deepspeed.ops
    import torch.distributed as dist
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    if not torch.cuda.is_available():
        # On the CPU, DeepSpeed's comm layer JIT-compiles a shared-memory all-reduce that only its inference path
        # uses (minutes, and a C++ compiler); marking the op unavailable in DeepSpeed's op table (a cache it keeps
        # editable) leaves every collective to gloo. Training needs nothing else from the table.
        vars(deepspeed.ops).setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False

    # accelerate initialised torch.distributed; DeepSpeed's comm layer wraps that process group.
    deepspeed.init_distributed(dist_backend=dist.get_backend(), verbose=False)
    flatten = attn_implementation.startswith("flash")
    if not flatten:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        # Registered under the backend's own name (the table the models read) before DeepSpeed captures it as its
        # core attention and registers its own wrapper there in turn.
        core = ALL_ATTENTION_FUNCTIONS[attn_implementation]
        ALL_ATTENTION_FUNCTIONS[attn_implementation] = segment_attention(core)
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model,
        core_attn_implementation=attn_implementation,
        sequence_parallel_size=size,
        micro_batch_size=1 if flatten else micro_batch_size,
        seq_length_is_variable=True,
    )
    return SequenceSplit(size, mpu.get_sequence_parallel_rank(), mpu.get_sequence_parallel_group(), flatten)
