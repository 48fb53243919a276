"""The scoring kernel shared by every NLL-based evaluation: per-token NLL without full-length logits.

:func:`token_nll` scores one sequence from the final hidden states, projected onto the vocabulary
``chunk_size`` positions at a time (full-length float32 logits are never materialized);
:func:`sliding_windows` / :func:`sliding_nll` score a long document with windows moved by a stride, each
token once, from its window. Perplexity, LongPPL, the factor search, answer scoring and the merge
smoke test all use these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ctxext.errors import InputError
from ctxext.models.load import base_model
from ctxext.rope.runtime import reset_dynamic_rope

# Positions projected onto the vocabulary at once. On the CPU a 256-row chunk of logits (32 MB at a 32k
# vocabulary) stays in cache and scores ~15 % faster than 1024 rows (measured, benchmarks/eval_speed.py);
# a GPU wants bigger matmuls.
CHUNK_CPU = 256
CHUNK_GPU = 2048


def default_chunk(device: torch.device) -> int:
    """The default scoring chunk for a device (256 positions on the CPU, 2048 on a GPU)."""
    return CHUNK_GPU if device.type == "cuda" else CHUNK_CPU


# ---------------------------------------------------------------------------------------------
# Scoring primitives
# ---------------------------------------------------------------------------------------------


def head_and_decoder(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module, float | None]:
    """The decoder, the LM head and the final-logit softcap (None when the model has none) of a causal LM."""
    base = base_model(model)
    decoder = base.get_decoder()
    head = base.get_output_embeddings()
    if decoder is None or head is None:
        raise InputError(f"{type(base).__name__} exposes no decoder / output embeddings; is it a causal LM?")
    softcap = getattr(base.config, "final_logit_softcapping", None)
    return decoder, head, softcap


@torch.no_grad()
def token_nll(
    model: torch.nn.Module, input_ids: torch.Tensor, score_from: int = 1, chunk_size: int | None = None
) -> torch.Tensor:
    """Per-token NLL of ``input_ids[:, score_from:]``, each token predicted from the tokens before it.

    The decoder runs once; its final hidden states are projected onto the vocabulary ``chunk_size``
    positions at a time, so peak extra memory is one chunk of logits, not ``T × vocab`` floats.

    Args:
        model: a causal LM (possibly a ``PeftModel``).
        input_ids: ``[batch, T]`` token ids (no padding).
        score_from: the first position scored (``≥ 1``).
        chunk_size: positions projected at once (default: :func:`default_chunk`).

    Returns:
        ``[batch, T − score_from]`` float32 NLLs (natural log).
    """
    return token_scores(model, input_ids, score_from, chunk_size)[0]


def token_scores(
    model: torch.nn.Module, input_ids: torch.Tensor, score_from: int = 1, chunk_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_nll` and, from the same pass, whether each token is the argmax of its logits.

    A long input can then give a document's perplexity and its teacher-forced answers (an answer is correct
    iff all its tokens are argmax hits) from one forward pass.

    Returns:
        ``[batch, T − score_from]`` float32 NLLs and bool argmax hits.
    """
    decoder, head, softcap = head_and_decoder(model)
    device = next(model.parameters()).device
    chunk_size = chunk_size or default_chunk(device)
    ids = input_ids.to(device)
    hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state
    # The hidden state at position p predicts token p + 1.
    hidden = hidden[:, score_from - 1 : -1]
    targets = ids[:, score_from:]
    b, n, d = hidden.shape
    flat_h = hidden.reshape(b * n, d)
    flat_t = targets.reshape(b * n)
    out = torch.empty(b * n, dtype=torch.float32, device=device)
    hits = torch.empty(b * n, dtype=torch.bool, device=device)
    for start in range(0, b * n, chunk_size):
        end = min(start + chunk_size, b * n)
        logits = head(flat_h[start:end]).float()
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        out[start:end] = F.cross_entropy(logits, flat_t[start:end], reduction="none")
        hits[start:end] = logits.argmax(dim=-1) == flat_t[start:end]
        del logits
    return out.reshape(b, n).cpu(), hits.reshape(b, n).cpu()


@dataclass(frozen=True)
class Window:
    """One window of a sliding-window scoring.

    Attributes:
        begin: first token of the window.
        end: one past its last token.
        score_from: offset (within the window) of the first scored position.
    """

    begin: int
    end: int
    score_from: int


def sliding_windows(n_tokens: int, window: int, stride: int) -> list[Window]:
    """The windows of the transformers-docs strided evaluation; every position ``1..n−1`` is scored once.

    Args:
        n_tokens: document length.
        window: window length (the context limit).
        stride: how far a window moves; the first window scores all its tokens, later ones only
            the tokens that the previous window did not reach.

    Returns:
        The windows, in order.
    """
    if stride < 1 or stride >= window:
        # A window's first token has no context inside it: a stride of a whole window leaves it unscored.
        raise InputError(f"stride {stride} must be at least 1 and below the window length {window}")
    wins: list[Window] = []
    begin, prev_end = 0, 0
    while True:
        end = min(begin + window, n_tokens)
        wins.append(Window(begin, end, max(prev_end, begin + 1) - begin))
        prev_end = end
        if end >= n_tokens:
            return wins
        begin += stride


@torch.no_grad()
def sliding_nll(
    model: torch.nn.Module,
    ids: torch.Tensor,
    window: int,
    stride: int,
    chunk_size: int | None = None,
    batch_tokens: int = 16384,
    reset_rope: bool = False,
    advance: Callable[[float], None] | None = None,
) -> torch.Tensor:
    """NLL of every position ``1..n−1`` of one document, each scored from its sliding window.

    Windows of equal shape run batched (up to ``batch_tokens`` tokens per forward pass).

    Args:
        model: the causal LM.
        ids: ``[n]`` token ids of one document.
        window: window length.
        stride: window step.
        chunk_size: positions projected onto the vocabulary at once.
        batch_tokens: tokens per batched forward pass.
        reset_rope: reset length-dependent rotary state before every pass.
        advance: progress callback, called with the number of positions scored.

    Returns:
        ``[n − 1]`` float32 NLLs; entry ``t − 1`` is the NLL of token ``t``.
    """
    n = int(ids.shape[0])
    out = torch.empty(n - 1, dtype=torch.float32)
    groups: dict[tuple[int, int], list[Window]] = {}
    for w in sliding_windows(n, window, stride):
        groups.setdefault((w.end - w.begin, w.score_from), []).append(w)
    for (length, score_from), wins in groups.items():
        per_batch = max(1, batch_tokens // length)
        for i in range(0, len(wins), per_batch):
            batch = wins[i : i + per_batch]
            x = torch.stack([ids[w.begin : w.end] for w in batch])
            if reset_rope:
                reset_dynamic_rope(model)
            nll = token_nll(model, x, score_from, chunk_size)
            for w, row in zip(batch, nll, strict=True):
                out[w.begin + score_from - 1 : w.end - 1] = row
            if advance is not None:
                advance(float(nll.numel()))
    return out
