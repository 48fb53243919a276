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
length run batched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ctxext.errors import InputError
from ctxext.evaluation.perplexity import _head_and_decoder
from ctxext.evaluation.progress import progress_bar
from ctxext.rope import reset_dynamic_rope

# Tokens per batched forward pass on the CPU / a GPU (sequences of one length are stacked up to this).
BATCH_TOKENS_CPU = 16384
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


def _check(sequences: list[list[int]], answer_spans: list[tuple[int, int]]) -> None:
    if len(sequences) != len(answer_spans):
        raise InputError(f"{len(sequences)} sequences but {len(answer_spans)} answer spans: give one span per sequence")
    for i, (seq, (start, end)) in enumerate(zip(sequences, answer_spans, strict=True)):
        if not 1 <= start < end <= len(seq):
            raise InputError(
                f"answer span ({start}, {end}) of sequence {i} (length {len(seq)}) must satisfy "
                "1 ≤ start < end ≤ length: the answer needs at least one token and a prompt before it"
            )


@torch.no_grad()
def score_answers(
    model: torch.nn.Module,
    sequences: list[list[int]],
    answer_spans: list[tuple[int, int]],
    *,
    batch_tokens: int | None = None,
    show_progress: bool = False,
) -> list[AnswerScore]:
    """Score answers teacher-forced: one causal forward pass per batch of equal-length sequences.

    Args:
        model: a causal LM (possibly a ``PeftModel``).
        sequences: token ids of prompt + answer, one list per item.
        answer_spans: ``(start, end)`` of the answer tokens in each sequence (``sequence[start:end]``).
        batch_tokens: tokens per forward pass (default 16384 on the CPU, 131072 on a GPU).
        show_progress: draw a progress bar.

    Returns:
        One :class:`AnswerScore` per sequence, in order.

    Raises:
        InputError: mismatched inputs or an answer span outside its sequence.
    """
    _check(sequences, answer_spans)
    decoder, head, softcap = _head_and_decoder(model)
    device = next(model.parameters()).device
    if batch_tokens is None:
        batch_tokens = BATCH_TOKENS_GPU if device.type == "cuda" else BATCH_TOKENS_CPU
    groups: dict[int, list[int]] = {}
    for i, seq in enumerate(sequences):
        groups.setdefault(len(seq), []).append(i)
    out: list[AnswerScore | None] = [None] * len(sequences)
    with progress_bar("answers", len(sequences), show_progress) as advance:
        for length, members in sorted(groups.items()):
            per_batch = max(1, batch_tokens // length)
            for b in range(0, len(members), per_batch):
                batch = members[b : b + per_batch]
                ids = torch.tensor([sequences[i] for i in batch], dtype=torch.long, device=device)
                # Length-dependent RoPE keeps the frequencies of the longest sequence seen: reset, so
                # this pass uses the frequencies of its own length whatever ran before.
                reset_dynamic_rope(model)
                hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state
                # The hidden state at position p predicts token p + 1: gather only those before answers.
                rows: list[int] = []
                cols: list[int] = []
                for r, i in enumerate(batch):
                    start, end = answer_spans[i]
                    rows += [r] * (end - start)
                    cols += list(range(start - 1, end - 1))
                rows_t = torch.tensor(rows, device=device)
                cols_t = torch.tensor(cols, device=device)
                logits = head(hidden[rows_t, cols_t]).float()
                if softcap:
                    logits = torch.tanh(logits / softcap) * softcap
                targets = ids[rows_t, cols_t + 1]
                nll = F.cross_entropy(logits, targets, reduction="none").double().cpu()
                hit = (logits.argmax(dim=-1) == targets).cpu()
                at = 0
                for i in batch:
                    n = answer_spans[i][1] - answer_spans[i][0]
                    out[i] = AnswerScore(
                        correct=bool(hit[at : at + n].all()), nll=float(nll[at : at + n].sum()), n_tokens=n
                    )
                    at += n
                del hidden, logits
                advance(len(batch))
    reset_dynamic_rope(model)
    return [s for s in out if s is not None]
