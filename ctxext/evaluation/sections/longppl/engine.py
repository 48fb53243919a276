"""LongPPL (Fang et al. 2024, arXiv 2410.23771): perplexity on the tokens that need the far context.

Plain perplexity averages over every token, and almost every token of a long document is predicted as
well from a short window as from the whole document; a model can lose its far context and keep its
perplexity. LongPPL scores only the *key tokens*: those whose log-probability the long context raises.

Definition followed (the paper's LSD / LCL key-token rule and its reference code):

* ``LCL(x_t) = log P(x_t | x_<t)``: the token scored with the whole document prefix (truncated to the
  evaluation length ``L``: the truncated-document protocol of :mod:`ctxext.evaluation.sections.perplexity.engine`);
* the short-context score ``log P(x_t | s_t)``: windows of ``K + S`` tokens moved by ``S``
  (:func:`~ctxext.scoring.nll.sliding_nll`), so a token at position ``t ≥ K + S`` sees between
  ``K`` and ``K + S − 1`` tokens — exactly the reference code's ``trunc_len = K = 4096``, ``internal = S =
  1024``; tokens before ``K + S`` see all of theirs (gain 0, never key);
* ``LSD(x_t) = LCL(x_t) − log P(x_t | s_t)`` (long-short difference);
* key token: ``LSD > α`` **and** ``LCL > β``, with the paper's ``α = 2``, ``β = −2`` (nats) by default;
* the key tokens are chosen **once**, by one *evaluator* model, and every model's LongPPL is
  ``exp(mean NLL)`` of its own full-context scores on those tokens: models are compared on the same
  tokens of the same documents (paired);
* next to it, plain perplexity over all tokens ``1..L−1`` of the same documents, and the number of key
  tokens; 95 % bootstrap intervals over documents (:func:`~ctxext.scoring.stats.ppl_entry`).

Where ctxext differs from the paper: the evaluator is, by default, a model of the run — the reference
model (the longest configured context; ``evaluator:`` names another) — where the paper uses a fixed
large model (Qwen2-72B-Instruct); ``K`` defaults to the reference model's original window ("1x"; the
paper's 4096 is Llama-2's); ``S`` defaults to ``K / 4`` (the paper's 1024 for 4096). The paper maps key
tokens between tokenizers through character offsets; ctxext pairs token positions, so a model whose
tokenizer splits the documents differently is reported as not scored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctxext.errors import InputError
from ctxext.evaluation.sections.longppl.settings import LongPPLSettings

DEFINITION = (
    "LongPPL (Fang et al. 2024): perplexity over key tokens, those with LSD = log P(long) - log P(short) > "
    "lsd_threshold and LCL = log P(long) > lcl_threshold under the evaluator; short context: windows of "
    "K + S tokens moved by S (each token sees K to K + S - 1 tokens); chosen once, every model scored on them"
)


def select_key_tokens(long_nll: Any, short_nll: Any, lsd_threshold: float, lcl_threshold: float) -> Any:
    """Positions of the key tokens of one document: ``LSD > α`` and ``LCL > β``.

    Args:
        long_nll: ``[n − 1]`` NLLs with the full context; entry ``t − 1`` is token ``t``'s.
        short_nll: the same tokens' NLLs with the short context.
        lsd_threshold: α, nats.
        lcl_threshold: β, nats (a log-probability: ≤ 0).

    Returns:
        A 1-D ``torch.long`` tensor of token positions ``t`` (ascending).
    """
    import torch

    lsd = short_nll - long_nll  # log P(long) − log P(short)
    keep = (lsd > lsd_threshold) & (-long_nll > lcl_threshold)
    return torch.nonzero(keep).flatten() + 1


@dataclass
class ModelScores:
    """One model's full-context NLLs (per length, per document) and its documents' content keys."""

    doc_keys: list[str]
    nll: dict[int, list[Any]]
    context: int


@dataclass
class LongPPLRun:
    """The state of one suite run: settings resolved, the evaluator, every model's scores.

    Attributes:
        short_context: ``K`` in tokens.
        stride: ``S`` in tokens.
        evaluator: the evaluator's label once known (``None``: the first model at the reference context).
        context: the reference model's configured context.
        keys: per length, the key positions of each document (from the evaluator).
        gains: per length, the evaluator's mean LSD over the candidate tokens (positions ``≥ K + S``).
        candidates: per length, the number of those candidate tokens.
        models: scores by model label.
        lengths: the evaluation lengths in tokens (set by the first model scored).
    """

    short_context: int
    stride: int
    evaluator: str | None
    context: int
    keys: dict[int, list[Any]] = field(default_factory=dict)
    gains: dict[int, float] = field(default_factory=dict)
    candidates: dict[int, int] = field(default_factory=dict)
    models: dict[str, ModelScores] = field(default_factory=dict)
    lengths: list[int] = field(default_factory=list)


def resolve_run(settings: LongPPLSettings, models: tuple[str, ...], original: int, context: int) -> LongPPLRun:
    """Check the settings against the run (model labels, lengths) and resolve ``K`` and ``S``.

    Args:
        settings: the section's settings.
        models: the run's model labels.
        original: the reference model's original context (``"1x"``).
        context: the reference model's configured context (``"target"``).

    Raises:
        InputError: an evaluator that is no model of the run, or a short context that leaves no token to score.
    """
    from ctxext.evaluation.lengths import resolve_length, resolve_lengths

    if settings.evaluator is not None and settings.evaluator not in models:
        raise InputError(
            f"longppl.evaluator {settings.evaluator!r} is not a model of this run; models: {', '.join(models)} "
            "(give a --model label, or leave it unset for the reference model)"
        )
    k = resolve_length(settings.short_context, original, context)
    s = settings.stride or max(1, k // 4)
    # The suite's plan keeps these lengths or drops only the longer ones: the shortest is the shortest run.
    lengths, _ = resolve_lengths(settings.lengths, original, context, True)
    if k < 1 or k + s >= min(lengths):
        raise InputError(
            f"longppl.short_context {k} + longppl.stride {s} tokens must stay below the shortest longppl length "
            f"{min(lengths)}: only tokens after the first K + S positions can gain from the far context. Use a "
            "shorter short_context / stride or longer lengths"
        )
    return LongPPLRun(short_context=k, stride=s, evaluator=settings.evaluator, context=context)


def _documents(loaded: Any, settings: LongPPLSettings, longest: int) -> list[Any]:
    from ctxext.scoring.documents import tokenize_documents
    from ctxext.scoring.texts import iter_texts

    texts = iter_texts(settings.data, settings.text_field, settings.split)
    docs = tokenize_documents(texts, loaded.tokenizer, longest, settings.max_docs, longest)
    if len(docs.ids) < settings.min_docs:
        raise InputError(
            f"longppl: {len(docs.ids)} document(s) of {settings.data} reach {longest} tokens ({docs.read} read), "
            f"{settings.min_docs} needed (longppl.min_docs): use shorter longppl.lengths, a source with longer "
            "documents (longppl.data), or a lower min_docs"
        )
    return [d[:longest] for d in docs.ids]


def _by_length(score: Any, doc: Any, lengths: list[int], dynamic: bool) -> dict[int, Any]:
    # Static RoPE: one pass at the longest length gives every shorter one (causal attention); length-
    # dependent RoPE (dynamic, longrope) needs a pass per length (``score`` resets its rotary state).
    if not dynamic:
        nll = score(doc)
        return {L: nll[: L - 1] for L in lengths}
    return {L: score(doc[:L]) for L in lengths}


def score_model(loaded: Any, settings: LongPPLSettings, run: LongPPLRun, lengths: list[int], show: bool) -> None:
    """Score one model: full-context NLLs of every document at every length; the key tokens if it is the evaluator.

    The results stay in ``run`` until :func:`finish_run` (the evaluator may come after other models).
    """
    from ctxext.progress import progress
    from ctxext.rope.runtime import reset_dynamic_rope
    from ctxext.rope.scaling_types import LENGTH_DEPENDENT_TYPES
    from ctxext.scoring.documents import document_key
    from ctxext.scoring.nll import sliding_nll, token_nll

    run.lengths = list(lengths)
    longest = lengths[-1]
    docs = _documents(loaded, settings, longest)
    dynamic = loaded.rope.rope_type in LENGTH_DEPENDENT_TYPES
    is_evaluator = run.evaluator == loaded.name or (run.evaluator is None and loaded.context_length >= run.context)
    window, stride = run.short_context + run.stride, run.stride
    passes = 2 if is_evaluator else 1

    def full(ids: Any) -> Any:
        reset_dynamic_rope(loaded.model)
        return token_nll(loaded.model, ids[None])[0]

    def short(ids: Any) -> Any:
        return sliding_nll(loaded.model, ids, window, stride, reset_rope=dynamic)

    nll: dict[int, list[Any]] = {L: [] for L in lengths}
    short_nll: dict[int, list[Any]] = {L: [] for L in lengths}
    with progress(f"longppl {loaded.name}", len(docs) * passes, enabled=show) as advance:
        for doc in docs:
            for L, v in _by_length(full, doc, lengths, dynamic).items():
                nll[L].append(v)
            advance(1)
            if is_evaluator:
                for L, v in _by_length(short, doc, lengths, dynamic).items():
                    short_nll[L].append(v)
                advance(1)
    reset_dynamic_rope(loaded.model)
    run.models[loaded.name] = ModelScores([document_key(d) for d in docs], nll, loaded.context_length)
    if is_evaluator:
        run.evaluator = loaded.name
        _select(run, settings, nll, short_nll)


def _select(run: LongPPLRun, settings: LongPPLSettings, nll: dict[int, list[Any]], short: dict[int, list[Any]]) -> None:
    # The evaluator's key tokens per length and document, and its mean gain over the candidate tokens.
    first = run.short_context + run.stride  # tokens before K + S saw their whole prefix in both scorings
    for L, long_nll in nll.items():
        pairs = list(zip(long_nll, short[L], strict=True))
        run.keys[L] = [select_key_tokens(a, b, settings.lsd_threshold, settings.lcl_threshold) for a, b in pairs]
        gain = sum(float((b[first - 1 :] - a[first - 1 :]).double().sum()) for a, b in pairs)
        run.candidates[L] = len(pairs) * max(0, L - first)
        run.gains[L] = gain / run.candidates[L] if run.candidates[L] else math.nan


def model_result(name: str, settings: LongPPLSettings, run: LongPPLRun) -> dict[str, Any]:
    """The ``longppl`` section of one model's report entry (after every model, the evaluator included, ran)."""
    from ctxext.scoring.stats import ppl_entry

    lengths = run.lengths
    scores = run.models[name]
    evaluator = run.models[run.evaluator] if run.evaluator else None
    out: dict[str, Any] = {
        "definition": DEFINITION,
        "evaluator": run.evaluator,
        "settings": {
            **settings.model_dump(),
            "lengths": lengths,
            "short_context": run.short_context,
            "stride": run.stride,
        },
        "by_length": {},
    }
    if evaluator is None:
        out["note"] = "not scored: no model of the run was the evaluator"
        return out
    if scores.doc_keys != evaluator.doc_keys:
        out["note"] = (
            f"not scored: {name}'s tokenizer splits the documents differently from the evaluator's "
            f"({run.evaluator}); key tokens are paired by position"
        )
        return out
    per_doc: dict[str, Any] = {}
    for L in lengths:
        keys = run.keys[L]
        key_sums = np.array([float(v[k - 1].double().sum()) for v, k in zip(scores.nll[L], keys, strict=True)])
        key_counts = np.array([len(k) for k in keys])
        sums = np.array([float(v.double().sum()) for v in scores.nll[L]])
        counts = np.array([len(v) for v in scores.nll[L]])
        scored = int(counts.sum())
        # Documents without a key token add nothing, but would turn resamples of only them into NLL 0 (ppl 1).
        has = key_counts > 0
        out["by_length"][str(L)] = {
            "longppl": ppl_entry(key_sums[has], key_counts[has], settings.resamples, settings.seed),
            "ppl": ppl_entry(sums, counts, settings.resamples, settings.seed),
            "key_tokens": int(key_counts.sum()),
            "scored_tokens": scored,
            "key_fraction": float(key_counts.sum()) / scored if scored else None,
            "evaluator_mean_lsd": run.gains.get(L),
            "beyond_context": L > scores.context,
        }
        if L <= run.short_context + run.stride:  # every token's short window is its whole prefix
            out["by_length"][str(L)]["note"] = "no candidate token: the length is within K + S"
        per_doc[str(L)] = {
            "key_nll_sums": key_sums.tolist(),
            "key_tokens": key_counts.tolist(),
            "nll_sums": sums.tolist(),
            "tokens": counts.tolist(),
        }
        if name == run.evaluator:  # which tokens were key, once per report (token positions in each document)
            per_doc[str(L)]["key_positions"] = [k.tolist() for k in keys]
    out["per_document"] = {"keys": scores.doc_keys, "by_length": per_doc}
    return out
