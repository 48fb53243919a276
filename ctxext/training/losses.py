"""Chunked cross-entropy over final hidden states: the loss never holds full-length float32 logits.

At long sequence lengths with 32k–128k vocabularies the logits, not attention, dominate training
memory: 16k tokens × 128k vocabulary × 4 bytes is 8 GB for the logits alone, and a plain
``cross_entropy`` keeps them (and their softmax) alive for the backward pass. Here the projection
onto the vocabulary and the cross-entropy are computed together, ``chunk_size`` tokens at a time, in
a custom autograd function that keeps no logits: it forms the gradients chunk by chunk while each
chunk's logits exist. Peak extra memory is one chunk of logits (the idea of Liger Kernel's fused
linear cross-entropy and of Cut Cross-Entropy, written with plain matmuls).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # The matmul runs in the head's dtype: a bf16 residual stream (train.memory) meets peft's fp32 head one chunk
    # at a time, never as a full-length fp32 copy. Only the chunk of logits is upcast to float32.
    logits = F.linear(hidden.to(weight.dtype), weight, bias)
    return logits if logits.dtype == torch.float64 else logits.float()


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Sum of token cross-entropies of ``hidden @ weight.T + bias`` against ``labels``, chunk by chunk.

    When gradients are needed they are formed in the forward pass, chunk by chunk, while each
    chunk's logits exist anyway (Liger Kernel's fused linear cross-entropy does the same): the
    backward only scales them by the incoming gradient. That is as many matmuls as a plain loss
    (no recomputation) and one exponential pass per logit; what stays alive until the backward is
    the gradient of ``hidden`` (the size of ``hidden``) and of ``weight`` (the size of ``weight``).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk_size):
        n = hidden.shape[0]
        acc = torch.promote_types(hidden.dtype, torch.float32)
        total = torch.zeros((), dtype=acc, device=hidden.device)
        need_h, need_w = hidden.requires_grad, weight.requires_grad
        need_b = bias is not None and bias.requires_grad
        grad_h = torch.empty_like(hidden) if need_h else None
        # Weight gradients accumulate in (at least) float32 across chunks, then are cast once.
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_b else None
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            h = hidden[start:end]
            lab = labels[start:end]
            valid = lab != IGNORE_INDEX
            safe = lab.clamp(min=0).unsqueeze(1)
            logits = _chunk_logits(h, weight, bias)
            target = logits.gather(1, safe).squeeze(1)
            # log-sum-exp and softmax from one exponential pass, in place on the chunk's logits.
            peak = logits.amax(dim=1, keepdim=True)
            probs = logits.sub_(peak).exp_()
            norm = probs.sum(dim=1, keepdim=True)
            lse = peak.squeeze(1) + norm.squeeze(1).log()
            total += torch.where(valid, lse - target, torch.zeros_like(lse)).sum()
            if need_h or need_w or need_b:
                # d(lse - target)/d logits = softmax - onehot(target); zero for ignored tokens.
                probs.div_(norm)
                probs.scatter_add_(1, safe, torch.full_like(target, -1.0).unsqueeze(1))
                probs.mul_(valid.unsqueeze(1))
                if grad_h is not None:
                    grad_h[start:end] = (probs.to(weight.dtype) @ weight).to(hidden.dtype)
                if grad_w is not None:
                    grad_w.addmm_(probs.t(), h.to(acc))
                if grad_b is not None:
                    grad_b += probs.sum(0)
            del logits, probs
        ctx.save_for_backward(
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
        )
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        scale = lambda g: None if g is None else g * grad_total.to(g.dtype)  # noqa: E731
        return scale(grad_h), scale(grad_w), scale(grad_b), None, None


def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None = None,
    chunk_size: int = 1024,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T (+ bias)`` against ``labels`` without full-length logits.

    Equal in value and gradient to ``F.cross_entropy(F.linear(hidden, weight, bias).float(), labels,
    ignore_index=-100)``, but the float32 logits exist only ``chunk_size`` rows at a time.

    Args:
        hidden: final hidden states, ``(..., hidden_size)``; flattened to rows.
        weight: the output projection (``lm_head.weight``), ``(vocab, hidden_size)``.
        labels: target ids, same leading shape as ``hidden``; ``-100`` is ignored.
        bias: the output projection's bias, if any.
        chunk_size: rows per chunk.
        reduction: ``"mean"`` over non-ignored tokens, or ``"sum"``.

    Returns:
        A scalar float32 loss.

    Raises:
        ValueError: mismatched shapes or an unknown reduction.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', not {reduction!r}")
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    if h.shape[0] != y.shape[0]:
        raise ValueError(f"hidden has {h.shape[0]} rows but labels has {y.shape[0]}")
    total = _ChunkedLinearCrossEntropy.apply(h, weight, bias, y, int(chunk_size))
    if reduction == "sum":
        return total
    return total / (y != IGNORE_INDEX).sum().clamp(min=1)


def micro_batch_loss(total: torch.Tensor, labels: torch.Tensor, accumulation: int) -> torch.Tensor:
    """What one micro-batch adds to its optimizer step's loss: its summed token loss over its *positions*.

    The divisor is the number of label positions (``labels.numel()``, the same for every micro-batch of a
    run), not the number of scored tokens: every scored token then weighs ``1 / (positions × accumulation)``
    whatever else its micro-batch holds. Dividing by the scored tokens would give the few answer tokens of
    ``answer_only`` rows a weight that swings with their neighbours (large among other answer-only rows,
    small beside a fully scored corpus row). On rows where every token is scored the two agree up to the
    unscored last token of each row and document.

    Args:
        total: the micro-batch's summed token loss.
        labels: its labels (``-100``: not scored).
        accumulation: micro-batches per optimizer step.
    """
    return total / labels.numel() / accumulation
