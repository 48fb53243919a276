"""Sequence parallelism: one training sequence split over ``train.sequence_parallel_size`` processes (Ulysses).

DeepSpeed's Ulysses integration for Hugging Face models (``deepspeed.runtime.sequence_parallel.ulysses_sp``,
the ALST paper, arXiv 2506.13996) replaces the model's attention function: each process embeds, projects and
rotates its own ``T/N`` tokens, an all-to-all swaps the sequence split for a head split (every process then
attends over the whole sequence with ``heads/N`` heads), and a second all-to-all swaps back. Everything outside
attention (MLP, norms, the loss) sees only ``T/N`` tokens. ctxext uses it directly under its own accelerate loop
(DDP), not through accelerate's ``ParallelismConfig(sp_backend="deepspeed")``, which shards only prepared
DataLoaders inside the DeepSpeed engine; ``docs/sequence-split.md`` says why.

Which engine splits the heads is decided in one place, :func:`ctxext.recipe.parallel.ulysses_plan` (torch-free, so
``ctxext validate`` applies it too), from the head counts alone: DeepSpeed's
attention wherever it serves the shape (N divides the query heads, and N divides the key/value heads or is a
multiple of them: it then replicates them), ctxext's own (:mod:`ctxext.training.ulysses`) for the shapes it does not
serve (SmolLM2's 9 query / 3 key/value heads over 2 processes). Both give rank r the same contiguous query heads.

``train.context_parallel_size`` adds torch's ring attention (context parallelism, CUDA only) around the head split:
the processes of one sequence form a ``(context, sequence)`` grid, each row is first cut into context-parallel
shards (torch's load-balanced layout), each shard into the Ulysses group's pieces, and the SDPA call after the
all-to-all runs as a ring over the context-parallel group (:meth:`SequenceSplit.place`). So a split wider than the
heads allow goes to the ring, as ms-swift does.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from ctxext.errors import InputError
from ctxext.recipe.parallel import RING_KEY, SPLIT_KEY, UlyssesPlan, head_split_problem, ring_refusal, split_plan
from ctxext.training.data.rows import IGNORE_INDEX, ModelInputs

# The attention functions transformers registered before any split wrapped them (a later start wraps these again).
_CORES: dict[str, Callable[..., Any]] = {}


def _pad(inputs: ModelInputs, multiple: int, flatten: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids, labels and positions (always present), flattened if asked, padded at the end to a multiple."""
    ids, labels, positions = inputs.input_ids, inputs.labels, inputs.position_ids
    if positions is None:
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    if flatten and ids.shape[0] > 1:
        ids, labels, positions = (t.reshape(1, -1) for t in (ids, labels, positions))
    pad = -ids.shape[1] % multiple
    if pad:
        ids = torch.nn.functional.pad(ids, (0, pad), value=0)
        labels = torch.nn.functional.pad(labels, (0, pad), value=IGNORE_INDEX)
        more = positions[:, -1:] + torch.arange(1, pad + 1, device=positions.device)
        positions = torch.cat([positions, more], dim=1)
    return ids.contiguous(), labels.contiguous(), positions.contiguous()


@dataclass
class SequenceSplit:
    """This process's share of a sequence; ``size == 1`` without a ring is no split (inputs and loss unchanged).

    Attributes:
        size: processes per sequence in the head split (N, Ulysses).
        rank: this process's place in its Ulysses group (which slice it keeps).
        group: the Ulysses group's ``torch.distributed`` process group (``None`` without a split).
        flatten: the attention backend takes one flattened row (flash attention: variable-length sequences are
            found from position ids that restart at 0), so the micro-batch is flattened before it is split.
        ring: the context-parallel device mesh (torch's ring attention), ``None`` without one.
        engine: which attention splits the heads (:class:`UlyssesPlan`).
    """

    size: int = 1
    rank: int = 0
    group: Any = None
    flatten: bool = False
    ring: Any = None
    engine: str = "none"

    @property
    def active(self) -> bool:
        """Whether the processes of a group share each row (a head split, a ring, or both)."""
        return self.size > 1 or self.ring is not None

    def shard(self, inputs: ModelInputs) -> ModelInputs:
        """This process's slice of a micro-batch: padded to a multiple of N, global positions kept.

        A row of several documents arrives with a 4D mask and positions that restart at 0 at each document: the
        mask is dropped here and rebuilt from the gathered positions after the all-to-all (module doc).
        """
        if not self.active:
            return inputs
        ids, labels, positions = _pad(inputs, self.size, self.flatten)
        chunk = ids.shape[1] // self.size
        part = slice(chunk * self.rank, chunk * (self.rank + 1))
        ids, labels, positions = ids[:, part], labels[:, part], positions[:, part].contiguous()
        # An all-ones 2D mask keeps transformers from reading position jumps (PoSE, the ring's load-balanced
        # layout) as packed sequences when it builds the shard's mask; the split's attention drops that mask.
        mask = None if self.flatten else torch.ones_like(ids, dtype=torch.bool)
        return ModelInputs(ids.contiguous(), labels.contiguous(), positions, mask)

    @contextmanager
    def place(self, inputs: ModelInputs) -> Iterator[ModelInputs]:
        """This process's share of a micro-batch (already on its device), for a forward and backward inside.

        With a ring, torch's ``context_parallel`` first cuts the row into its load-balanced context-parallel
        shards (so padded to a multiple of twice the grid) and patches SDPA into ring attention until the block
        ends; the shard is then split over the Ulysses group as without a ring.
        """
        if self.ring is None:
            yield self.shard(inputs)
            return
        from torch.distributed.tensor.experimental import context_parallel

        # Copies: context_parallel shards its buffers in place.
        buffers = [t.clone() for t in _pad(inputs, 2 * self.ring.size() * self.size, self.flatten)]
        with context_parallel(self.ring, buffers=buffers, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(buffers)):
            yield self.shard(ModelInputs(*buffers))


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


def ring_attention(core: Callable[..., Any]) -> Callable[..., Any]:
    """An attention function for torch's ring: causal without a mask, key/value heads expanded to the query heads.

    Inside ``context_parallel`` SDPA runs as ring attention, which takes no mask (documents are refused with a
    ring) and equal head counts.
    """
    from transformers.integrations.sdpa_attention import repeat_kv

    def attend(
        module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, Any]:
        repeat = query.shape[1] // key.shape[1]
        saved = getattr(module, "num_key_value_groups", 1)
        module.num_key_value_groups = 1
        try:
            return core(module, query, repeat_kv(key, repeat), repeat_kv(value, repeat), None, *args, **kwargs)
        finally:
            module.num_key_value_groups = saved

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


def check_heads(config: Any, size: int) -> UlyssesPlan:
    """The head plan for a model's config (:func:`ctxext.recipe.parallel.split_plan`), refusing what cannot run here.

    Raises:
        InputError: a head shape no engine here splits, or DeepSpeed missing where its attention serves the shape.
    """
    import importlib.util

    problem = head_split_problem(config, size, importlib.util.find_spec("deepspeed") is not None)
    if problem:
        raise InputError(f"{SPLIT_KEY}: {problem}")
    plan = split_plan(config, size)
    assert isinstance(plan, UlyssesPlan)  # refused above otherwise
    return plan


def start_sequence_parallel(
    size: int, model: Any, attn_implementation: str, micro_batch_size: int, context_parallel: int = 1
) -> SequenceSplit:
    """Install the split's attention for ``model`` and return this process's :class:`SequenceSplit`.

    Call it once per process, after ``torch.distributed`` is initialised (the accelerator), on every process.
    The processes of one sequence are consecutive ranks, a ``(context, sequence)`` grid with the Ulysses group
    innermost (its all-to-all is the heavier exchange: within a node).

    Args:
        size: processes per sequence in the head split; 1 without a ring returns ``SequenceSplit()``.
        model: the (peft-wrapped) model; its config gives the head counts.
        attn_implementation: the model's attention implementation (``sdpa`` or a flash variant).
        micro_batch_size: rows per micro-batch.
        context_parallel: processes per sequence in the ring (``train.context_parallel_size``).

    Raises:
        InputError: a head shape no engine splits, or a ring this machine or model cannot run.
    """
    if size == 1 and context_parallel == 1:
        return SequenceSplit()
    plan = check_heads(model.config, size)
    if context_parallel > 1:
        refusal = ring_refusal(model.config, attn_implementation, torch.cuda.is_available())
        if refusal:
            raise InputError(f"{RING_KEY}: {context_parallel}: {refusal}")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    grid = size * context_parallel
    device = next(model.parameters()).device.type
    mesh = init_device_mesh(
        device, (dist.get_world_size() // grid, context_parallel, size), mesh_dim_names=("dp", "cp", "sp")
    )
    flatten = attn_implementation.startswith("flash")
    core = _CORES.setdefault(attn_implementation, ALL_ATTENTION_FUNCTIONS[attn_implementation])
    if context_parallel > 1:
        core = ring_attention(core)
    if not flatten:
        core = segment_attention(core)
    split = SequenceSplit(size, mesh.get_local_rank("sp"), mesh.get_group("sp"), flatten, engine=plan.engine)
    if context_parallel > 1:
        split.ring = mesh["cp"]
    if plan.engine == "deepspeed":
        _start_deepspeed(model, attn_implementation, core, size, 1 if flatten else micro_batch_size)
    elif plan.engine == "ctxext":
        from ctxext.training.ulysses import ulysses_attention

        ALL_ATTENTION_FUNCTIONS[attn_implementation] = ulysses_attention(plan, split.rank, split.group, core)
    else:
        ALL_ATTENTION_FUNCTIONS[attn_implementation] = core
    return split


def stop_sequence_parallel(model: Any = None) -> None:
    """Put back the attention functions a split replaced, so that this process attends on its own again.

    Args:
        model: the trained model, if it is used further here: DeepSpeed's attention rewrites its attention modules'
            ``num_key_value_groups`` when it replicates key/value heads; they get the config's value back.
    """
    if not _CORES:
        return
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    for name, core in _CORES.items():
        ALL_ATTENTION_FUNCTIONS[name] = core
    if model is not None:
        text = model.config.get_text_config()
        groups = text.num_attention_heads // (getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        for module in model.modules():
            if hasattr(module, "num_key_value_groups"):
                module.num_key_value_groups = groups


@contextmanager
def attention_unsplit(model: Any) -> Iterator[None]:
    """Each process attends on its own inside the block (whole rows: the adaptive stop's probe), split after it.

    Args:
        model: the model whose attention modules a DeepSpeed split may have changed (``num_key_value_groups``).
    """
    if not _CORES:
        yield
        return
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    split = {name: ALL_ATTENTION_FUNCTIONS[name] for name in _CORES}
    groups = {m: m.num_key_value_groups for m in model.modules() if hasattr(m, "num_key_value_groups")}
    stop_sequence_parallel(model)
    try:
        yield
    finally:
        for name, attend in split.items():
            ALL_ATTENTION_FUNCTIONS[name] = attend
        for module, value in groups.items():
            module.num_key_value_groups = value


def _start_deepspeed(model: Any, attn_implementation: str, core: Callable[..., Any], size: int, rows: int) -> None:
    """Register DeepSpeed's Ulysses attention around ``core`` (its groups: consecutive ranks, as the grid's)."""
    if not torch.cuda.is_available():
        # DeepSpeed picks its accelerator once, at import; on a machine without CUDA it must be the CPU one.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import deepspeed.ops
    import torch.distributed as dist
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if not torch.cuda.is_available():
        # On the CPU, DeepSpeed's comm layer JIT-compiles a shared-memory all-reduce that only its inference path
        # uses (minutes, and a C++ compiler); marking the op unavailable in DeepSpeed's op table (a cache it keeps
        # editable) leaves every collective to gloo. Training needs nothing else from the table.
        vars(deepspeed.ops).setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False

    # accelerate initialised torch.distributed; DeepSpeed's comm layer wraps that process group.
    deepspeed.init_distributed(dist_backend=dist.get_backend(), verbose=False)
    # Registered under the backend's own name (the table the models read) before DeepSpeed captures it as its core
    # attention and registers its own wrapper there in turn.
    ALL_ATTENTION_FUNCTIONS[attn_implementation] = core
    UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model,
        core_attn_implementation=attn_implementation,
        sequence_parallel_size=size,
        micro_batch_size=rows,
        seq_length_is_variable=True,
    )
