"""ctxext's own Ulysses attention: a sequence split for head shapes DeepSpeed's attention cannot serve.

DeepSpeed's ``UlyssesSPAttentionHF`` (the engine ctxext uses wherever it can) gives every process ``heads/N`` query
heads, so N must divide the query heads, and it replicates key/value heads only when N is a multiple of them.
SmolLM2-135M (9 query heads, 3 key/value heads) cannot be split over 2 processes there, nor a 3-head / 1-KV-head
model, and no other engine in the field serves those shapes with Hugging Face models: verl and prime-rl repeat key/value
heads inside their own trainers, ms-swift lowers the Ulysses degree to gcd(heads, GPUs) and rings the rest, TRL and
accelerate offer only DeepSpeed's Ulysses and torch's ring. So for exactly those shapes
(:func:`ctxext.recipe.parallel.ulysses_plan` chooses) ctxext runs this attention instead, with the same
contract as DeepSpeed's: registered in transformers' attention table under the backend's own name, fed each
process's ``T/N`` tokens with their global positions, returning each process's tokens with all heads.

How it splits (rank r of N, as :class:`~ctxext.recipe.parallel.UlyssesPlan` says):

* Query heads are shared out in contiguous, as-even-as-possible ranges (9 heads over 2: 4 and 5). Rank r receives
  its range for the whole sequence, and the key/value heads those query heads read (each query head reads key/value
  head ``h // (heads / kv_heads)``). A key/value head needed by two ranks is sent to both: it is replicated.
* The exchange is one ``all_to_all_single`` with split sizes per tensor (:class:`_AllToAll`, whose backward is the
  reverse exchange). What a rank sends is cut from its projections by slicing, so the replicas of a key/value head
  are slices of the same tensor: autograd sums their gradients back into the one head, and so into the one set of
  key/value weights.
* Attention runs locally over the gathered sequence with each query head mapped to its key/value head (expanded as
  transformers' ``repeat_kv`` does when a rank's heads do not group evenly), through the same core as DeepSpeed's
  path (documents cut at position restarts by :func:`~ctxext.training.sequence_parallel.segment_attention`).
* A second exchange returns each rank's own tokens with every query head, in head order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist


class HeadRanges(Protocol):
    """What this attention reads of a :class:`~ctxext.recipe.parallel.UlyssesPlan`."""

    @property
    def heads(self) -> int: ...  # noqa: D102

    @property
    def kv_heads(self) -> int: ...  # noqa: D102

    @property
    def query(self) -> tuple[tuple[int, int], ...]: ...  # noqa: D102

    @property
    def kv(self) -> tuple[tuple[int, int], ...]: ...  # noqa: D102


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of a flat tensor with split sizes; its backward is the reverse exchange."""

    @staticmethod
    def forward(ctx: Any, send: torch.Tensor, send_sizes: list[int], recv_sizes: list[int], group: Any) -> torch.Tensor:
        ctx.sizes, ctx.group = (send_sizes, recv_sizes), group
        out = send.new_empty(sum(recv_sizes))
        dist.all_to_all_single(out, send.contiguous(), recv_sizes, send_sizes, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        send_sizes, recv_sizes = ctx.sizes
        back = grad.new_empty(sum(send_sizes))
        dist.all_to_all_single(back, grad.contiguous(), send_sizes, recv_sizes, group=ctx.group)
        return back, None, None, None


def heads_to_sequence(x: torch.Tensor, ranges: tuple[tuple[int, int], ...], rank: int, group: Any) -> torch.Tensor:
    """This process's tokens of every head in, the whole sequence of this rank's heads out.

    Args:
        x: ``(B, heads, t, d)``: this process's ``t`` tokens.
        ranges: per rank, the ``[start, stop)`` heads it receives (ranges may overlap: replicated heads).
        rank: this process's rank in ``group``.
        group: the sequence-parallel process group.

    Returns:
        ``(B, stop - start, N * t, d)`` for this rank's range, tokens in rank order.
    """
    b, _, t, d = x.shape
    send = torch.cat([x[:, lo:hi].reshape(-1) for lo, hi in ranges])
    mine = ranges[rank][1] - ranges[rank][0]
    out = _AllToAll.apply(send, [b * (hi - lo) * t * d for lo, hi in ranges], [b * mine * t * d] * len(ranges), group)
    return out.view(len(ranges), b, mine, t, d).permute(1, 2, 0, 3, 4).reshape(b, mine, len(ranges) * t, d)


def sequence_to_heads(out: torch.Tensor, ranges: tuple[tuple[int, int], ...], rank: int, group: Any) -> torch.Tensor:
    """The attention output of this rank's heads over the whole sequence in, this process's tokens of all heads out.

    Args:
        out: ``(B, N * t, heads_r, d)`` (transformers' attention output layout).
        ranges: per rank, its ``[start, stop)`` query heads (disjoint, in order).
        rank: this process's rank in ``group``.
        group: the sequence-parallel process group.

    Returns:
        ``(B, t, heads, d)``.
    """
    n = len(ranges)
    b, total, mine, d = out.shape
    t = total // n
    send = out.reshape(b, n, t, mine, d).transpose(0, 1).reshape(-1)
    sizes = [b * t * (hi - lo) * d for lo, hi in ranges]
    back = _AllToAll.apply(send, [b * t * mine * d] * n, sizes, group)
    pieces = [p.view(b, t, hi - lo, d) for p, (lo, hi) in zip(back.split(sizes), ranges, strict=True)]
    return torch.cat(pieces, dim=2)


def local_kv_groups(plan: HeadRanges, rank: int) -> tuple[int, torch.Tensor | None]:
    """How this rank's query heads read its key/value heads.

    Returns:
        ``(groups, None)`` when every local key/value head serves the same number of consecutive local query heads
        (the model's own grouped attention applies, with ``groups`` query heads per key/value head), else
        ``(1, index)``: the local key/value head of each local query head, to expand with.
    """
    (q_lo, q_hi), (kv_lo, _) = plan.query[rank], plan.kv[rank]
    per_kv = plan.heads // plan.kv_heads
    index = torch.tensor([h // per_kv - kv_lo for h in range(q_lo, q_hi)])
    counts = torch.bincount(index)
    if bool((counts == counts[0]).all()):
        return int(counts[0]), None
    return 1, index


def ulysses_attention(plan: HeadRanges, rank: int, group: Any, core: Callable[..., Any]) -> Callable[..., Any]:
    """An attention function (transformers' signature) that splits heads over ``group`` as ``plan`` says.

    Args:
        plan: the head plan (its ``engine`` is ``ctxext``).
        rank: this process's rank in ``group``.
        group: the sequence-parallel process group (consecutive ranks).
        core: the attention over the gathered sequence (``segment_attention`` around SDPA, or flash attention).

    Returns:
        The function to register under the backend's name in ``ALL_ATTENTION_FUNCTIONS``.
    """
    groups, index = local_kv_groups(plan, rank)
    n = len(plan.query)

    def attend(
        module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, None]:
        positions = kwargs.get("position_ids")
        if positions is None:
            raise RuntimeError("the sequence split needs position_ids in every forward (SequenceSplit.shard adds them)")
        gathered = [torch.empty_like(positions) for _ in range(n)]
        dist.all_gather(gathered, positions.contiguous(), group=group)
        q = heads_to_sequence(query, plan.query, rank, group)
        k, v = (heads_to_sequence(t, plan.kv, rank, group) for t in (key, value))
        if index is not None:
            k, v = (t.index_select(1, index.to(t.device)) for t in (k, v))
        # The shard's mask is dropped, as DeepSpeed's wrapper does: documents are rebuilt from the gathered positions.
        saved = module.num_key_value_groups
        module.num_key_value_groups = groups
        try:
            out, _ = core(module, q, k, v, None, *args, **{**kwargs, "position_ids": torch.cat(gathered, dim=1)})
        finally:
            module.num_key_value_groups = saved
        return sequence_to_heads(out, plan.query, rank, group), None

    return attend
