"""Teacher-forced answer scoring: one forward pass over prompt + answer, exact for greedy decoding.

A greedy decoder emits, at every step, the argmax of the logits at the last position. The answer
``a_1 … a_m`` is therefore generated (as its first ``m`` tokens) iff, for every ``j``, ``a_j`` is the
argmax of the logits at the position before it given the prompt and ``a_1 … a_{j−1}`` — which is what
one causal forward pass over ``prompt + answer`` computes for all ``j`` at once. So

* ``correct`` is exactly "greedy decoding starts with the answer tokens" for RoPE types whose
  frequencies do not depend on the sequence length (the prompt needs no generation loop, no KV cache and
  no ``generation_config``: repetition penalties or n-gram blocking stored with a checkpoint cannot leak
  in);
* for ``dynamic`` / ``longrope`` the pass runs at the sequence's full length, with the rotary state reset
  first, so every answer token sees the frequencies of the evaluated length. Generation with a KV cache
  is *wrong* for them (cached keys keep the rotation of the prompt length while the frequencies change,
  transformers#25104); this scoring has no cache at all.

Only the positions that predict answer tokens are projected onto the vocabulary; sequences of equal
length run batched. The final decoder layer, too, runs in full only where answers are predicted: its
keys and values are needed at every position, but its queries, attention output, MLP and the final norm
only at the last few — for a Llama-structured layer (:func:`answer_only_last_layer`) those are all it
computes, which is exact (the same arithmetic on fewer rows) and saves most of one layer's work; other
architectures run the whole layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ctxext.errors import InputError
from ctxext.progress import progress
from ctxext.rope.runtime import reset_dynamic_rope
from ctxext.scoring.nll import head_and_decoder

# Tokens per batched forward pass on the CPU / a GPU (sequences of one length are stacked up to this). On the
# CPU small batches are faster per token: the activations of a pass stay in cache (the grown model's needle
# grid scores in 1.42 CPU s at 2048 tokens per pass, 1.75 s at 8192 or 32768; benchmarks/retrieval_speed.py).
BATCH_TOKENS_CPU = 2048
BATCH_TOKENS_GPU = 131072


@dataclass
class AnswerScore:
    """The teacher-forced score of one answer.

    Attributes:
        correct: every answer token is the argmax of the logits at the position before it (greedy
            decoding produces the answer).
        nll: sum of the answer tokens' negative log-likelihoods (nats).
        n_tokens: number of answer tokens.
    """

    correct: bool
    nll: float
    n_tokens: int


# Model types whose decoder layers are LlamaDecoderLayer-shaped (pre-norm attention + MLP, q/k/v/o projections,
# rotate-half RoPE, no q/k norms): the answer-only final layer below is exact for them.
_LLAMA_LAYER_TYPES = ("llama", "mistral", "qwen2")


class _StopBeforeLastLayer(Exception):
    """Raised by a pre-hook on the final decoder layer: its inputs are captured, the layer itself not run."""


def answer_only_last_layer(decoder: torch.nn.Module, length: int) -> torch.nn.Module | None:
    """The final decoder layer if it can run at answer positions only for sequences of ``length``, else None.

    Supported: Llama-structured layers (``llama``, ``mistral``, ``qwen2``) with full causal attention at
    this length (no sliding window shorter than it).
    """
    config = getattr(decoder, "config", None)
    if config is None or getattr(config, "model_type", None) not in _LLAMA_LAYER_TYPES:
        return None
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and window < length:
        return None
    layers = getattr(decoder, "layers", None)
    if layers is None or len(layers) < config.num_hidden_layers or not hasattr(decoder, "norm"):
        return None
    layer = layers[config.num_hidden_layers - 1]
    attn = getattr(layer, "self_attn", None)
    needed = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")
    if attn is None or not all(hasattr(attn, n) for n in needed) or hasattr(attn, "q_norm"):
        return None
    if not all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm", "mlp")):
        return None
    return layer


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Rotate-half RoPE as transformers applies it (cos / sin already carry any attention scaling).
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _decoder_until_last_layer(
    decoder: torch.nn.Module, layer: torch.nn.Module, ids: torch.Tensor
) -> tuple[dict[str, Any], torch.Tensor | None]:
    """Run every decoder layer before ``layer`` and capture ``layer``'s inputs (hidden states, position embeddings).

    Returns:
        The captured inputs, and None; or, where the layer is called in a form without them (then the
        decoder runs to the end), nothing captured and the decoder's final hidden states.
    """
    captured: dict[str, Any] = {}

    def grab(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if hidden is None or kwargs.get("position_embeddings") is None:
            return  # an unexpected call form: let the layer run, the full pass is used
        captured["hidden"], captured["position_embeddings"] = hidden, kwargs["position_embeddings"]
        # Stop the decoder here: the final layer runs afterwards, at the rows that matter only.
        raise _StopBeforeLastLayer

    handle = layer.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        return captured, decoder(input_ids=ids, use_cache=False).last_hidden_state
    except _StopBeforeLastLayer:
        return captured, None
    finally:
        handle.remove()


def _last_layer_at(
    layer: torch.nn.Module, hidden: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor], first: int
) -> torch.Tensor:
    """A Llama decoder layer's output at positions ``first …`` only (keys / values from every position).

    Unpadded causal attention: the query at position ``first + i`` sees the keys at positions ``0 … first + i``.
    """
    # transformers' decoder layers are used duck-typed (nn.Module types every attribute as Tensor | Module).
    block: Any = layer
    attn: Any = block.self_attn
    b, n, _ = hidden.shape
    x = block.input_layernorm(hidden)
    cos, sin = (t.unsqueeze(1) for t in position_embeddings)
    k = _rotate(attn.k_proj(x).view(b, n, -1, attn.head_dim).transpose(1, 2), cos, sin)
    v = attn.v_proj(x).view(b, n, -1, attn.head_dim).transpose(1, 2)
    q = attn.q_proj(x[:, first:]).view(b, n - first, -1, attn.head_dim).transpose(1, 2)
    q = _rotate(q, cos[:, :, first:], sin[:, :, first:])
    if k.shape[1] != q.shape[1]:  # grouped-query attention
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    mask = torch.ones(n - first, n, dtype=torch.bool, device=hidden.device).tril(diagonal=first)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
    h = hidden[:, first:] + attn.o_proj(out.transpose(1, 2).reshape(b, n - first, -1))
    return h + block.mlp(block.post_attention_layernorm(h))


def _final_hidden(
    decoder: torch.nn.Module, ids: torch.Tensor, first: int, answer_only: bool
) -> tuple[torch.Tensor, int]:
    """Final (normed) hidden states of positions ``offset …`` and that offset (``first``, or 0 for a full pass)."""
    layer = answer_only_last_layer(decoder, ids.shape[1]) if answer_only else None
    if layer is None:
        return decoder(input_ids=ids, use_cache=False).last_hidden_state, 0
    inputs, full = _decoder_until_last_layer(decoder, layer, ids)
    if full is not None:
        return full, 0
    norm: Any = decoder.norm
    return norm(_last_layer_at(layer, inputs["hidden"], inputs["position_embeddings"], first)), first


def _check(sequences: list[list[int]], answer_spans: list[list[tuple[int, int]]]) -> None:
    if len(sequences) != len(answer_spans):
        raise InputError(f"{len(sequences)} sequences but {len(answer_spans)} answer spans: give one span per sequence")
    for i, (seq, spans) in enumerate(zip(sequences, answer_spans, strict=True)):
        if not spans:
            raise InputError(f"sequence {i} has no answer span")
        for start, end in spans:
            if not 1 <= start < end <= len(seq):
                raise InputError(
                    f"answer span ({start}, {end}) of sequence {i} (length {len(seq)}) must satisfy "
                    "1 ≤ start < end ≤ length: the answer needs at least one token and a prompt before it"
                )


def score_answers(
    model: torch.nn.Module,
    sequences: list[list[int]],
    answer_spans: list[tuple[int, int]],
    *,
    batch_tokens: int | None = None,
    show_progress: bool = False,
    answer_only: bool = True,
    on_batch: Callable[[int], None] | None = None,
) -> list[AnswerScore]:
    """Score answers teacher-forced: one causal forward pass per batch of equal-length sequences.

    Args:
        model: a causal LM (possibly a ``PeftModel``).
        sequences: token ids of prompt + answer, one list per item.
        answer_spans: ``(start, end)`` of the answer tokens in each sequence (``sequence[start:end]``).
        batch_tokens: tokens per forward pass (default 2048 on the CPU, 131072 on a GPU).
        show_progress: draw a progress bar.
        answer_only: run the final decoder layer at answer positions only where the architecture allows
            (:func:`answer_only_last_layer`; the same scores, less work); False runs it everywhere.
        on_batch: called with the number of sequences each forward pass scored (a caller's own progress).

    Returns:
        One :class:`AnswerScore` per sequence, in order.

    Raises:
        InputError: mismatched inputs or an answer span outside its sequence.
    """
    if len(sequences) != len(answer_spans):
        raise InputError(f"{len(sequences)} sequences but {len(answer_spans)} answer spans: give one span per sequence")
    scored = score_answer_sets(
        model,
        sequences,
        [[span] for span in answer_spans],
        batch_tokens=batch_tokens,
        show_progress=show_progress,
        answer_only=answer_only,
        on_batch=on_batch,
    )
    return [s[0] for s in scored]


@torch.no_grad()
def score_answer_sets(
    model: torch.nn.Module,
    sequences: list[list[int]],
    answer_spans: list[list[tuple[int, int]]],
    *,
    batch_tokens: int | None = None,
    show_progress: bool = False,
    answer_only: bool = True,
    on_batch: Callable[[int], None] | None = None,
) -> list[list[AnswerScore]]:
    """Score several answers per sequence teacher-forced, one forward pass for all of them.

    A long input that asks several questions (each answer followed by the next question) scores every answer
    at once: each is correct iff greedy decoding, given everything before it, produces it. The answers of one
    sequence share its context, so statistics over them are clustered by sequence.

    Args:
        model: a causal LM (possibly a ``PeftModel``).
        sequences: token ids, one list per item.
        answer_spans: for each sequence, the ``(start, end)`` of each of its answers.
        batch_tokens: tokens per forward pass (default 2048 on the CPU, 131072 on a GPU).
        show_progress: draw a progress bar.
        answer_only: see :func:`score_answers`.
        on_batch: see :func:`score_answers`.

    Returns:
        For each sequence, one :class:`AnswerScore` per span, in order.

    Raises:
        InputError: mismatched inputs or an answer span outside its sequence.
    """
    _check(sequences, answer_spans)
    decoder, head, softcap = head_and_decoder(model)
    device = next(model.parameters()).device
    if batch_tokens is None:
        batch_tokens = BATCH_TOKENS_GPU if device.type == "cuda" else BATCH_TOKENS_CPU
    groups: dict[int, list[int]] = {}
    for i, seq in enumerate(sequences):
        groups.setdefault(len(seq), []).append(i)
    out: list[list[AnswerScore] | None] = [None] * len(sequences)
    with progress("answers", len(sequences), enabled=show_progress) as advance:
        for length, members in sorted(groups.items()):
            per_batch = max(1, batch_tokens // length)
            for b in range(0, len(members), per_batch):
                batch = members[b : b + per_batch]
                ids = torch.tensor([sequences[i] for i in batch], dtype=torch.long, device=device)
                # Length-dependent RoPE keeps the frequencies of the longest sequence seen: reset, so
                # this pass uses the frequencies of its own length whatever ran before.
                reset_dynamic_rope(model)
                # The hidden state at position p predicts token p + 1: only those before answers matter.
                first = min(start for i in batch for start, _ in answer_spans[i]) - 1
                hidden, offset = _final_hidden(decoder, ids, first, answer_only)
                rows: list[int] = []
                cols: list[int] = []
                for r, i in enumerate(batch):
                    for start, end in answer_spans[i]:
                        rows += [r] * (end - start)
                        cols += list(range(start - 1, end - 1))
                rows_t = torch.tensor(rows, device=device)
                cols_t = torch.tensor(cols, device=device)
                logits = head(hidden[rows_t, cols_t - offset]).float()
                if softcap:
                    logits = torch.tanh(logits / softcap) * softcap
                targets = ids[rows_t, cols_t + 1]
                nll = F.cross_entropy(logits, targets, reduction="none").double().cpu()
                hit = (logits.argmax(dim=-1) == targets).cpu()
                at = 0
                for i in batch:
                    scores = []
                    for start, end in answer_spans[i]:
                        n = end - start
                        scores.append(
                            AnswerScore(
                                correct=bool(hit[at : at + n].all()), nll=float(nll[at : at + n].sum()), n_tokens=n
                            )
                        )
                        at += n
                    out[i] = scores
                del hidden, logits
                advance(len(batch))
                if on_batch is not None:
                    on_batch(len(batch))
    reset_dynamic_rope(model)
    return [s for s in out if s is not None]
