"""Perplexity by evaluation length, by token position, and by usable context.

Protocol (truncated-document perplexity, as in the YaRN paper's proof-pile curves):

* each document is tokenized with the tokenizer's own defaults (a Llama tokenizer adds BOS) and
  truncated to the evaluation length ``L``; the NLL of the token at position ``t`` (``1 ≤ t < L``) is
  predicted from positions ``< t``; perplexity at ``L`` is ``exp`` of the mean NLL over all scored
  tokens (``L − 1`` per document) of the *common document set*: the documents that reach the longest
  length. Every length, every position bucket and the context-use curve average over the same documents,
  so a change across lengths is the model's, not the data's (``max_docs`` counts these documents);
* secondary view ``by_length_all``: at each ``L``, every document read that has at least ``L`` tokens
  (more documents at short lengths, but a different set at each length);
* fewer than ``min_docs`` documents in the common set is an error naming the length, the count and the
  fix (a bootstrap interval over one document has zero width);
* documents shorter than the shortest length are skipped and counted, never mixed in;
* for RoPE types whose frequencies do not depend on the input length, one forward pass at the
  longest length a document reaches gives every shorter length (attention is causal); ``dynamic``
  and ``longrope`` get one pass per length, with the rotary state reset between passes;
* scores come from the final hidden states, projected onto the vocabulary ``chunk_size`` tokens at a
  time: full-length float32 logits are never materialized;
* ``stride`` mode: whole documents are scored with windows of ``L`` tokens moved by ``stride`` (the
  transformers-docs protocol); every token is scored once, from its window;
* context-use curve: the same target tokens (positions ``[max(limits), L_max)`` of the documents that
  reach ``L_max``) scored again with windows of ``k`` tokens moved by ``k/2`` — each target then sees
  between ``k/2`` and ``k`` tokens of context — reported against their full-context score;
* every perplexity has a 95 % bootstrap interval over documents.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ctxext.errors import InputError
from ctxext.evaluation.lengths import check_lengths
from ctxext.evaluation.sections.perplexity.settings import PPL_PROTOCOL, SLIDING_PROTOCOL, PerplexitySettings
from ctxext.models.load import LoadedModel
from ctxext.progress import progress
from ctxext.rope.runtime import reset_dynamic_rope
from ctxext.rope.scaling_types import LENGTH_DEPENDENT_TYPES
from ctxext.scoring.documents import Documents, document_key, tokenize_documents, too_short_error
from ctxext.scoring.nll import (
    sliding_nll,
    sliding_windows,
    token_nll,
)
from ctxext.scoring.stats import bootstrap_mean_diff, ppl_entry

# ---------------------------------------------------------------------------------------------
# The evaluation
# ---------------------------------------------------------------------------------------------


@dataclass
class _Scores:
    # Per length: per-document NLL sums, token counts and document indices (into Documents.ids).
    by_length: dict[int, tuple[list[float], list[int], list[int]]] = field(default_factory=dict)
    full: list[torch.Tensor] = field(default_factory=list)  # NLL vectors of documents reaching L_max
    full_docs: list[int] = field(default_factory=list)  # their indices
    full_ids: list[torch.Tensor] = field(default_factory=list)  # their ids, truncated to L_max
    passes: int = 0
    tokens_processed: int = 0


def choose_mode(loaded: LoadedModel, settings: PerplexitySettings) -> str:
    """``sliding``, ``one-pass`` or ``per-length`` for this model and these settings.

    Raises:
        InputError: ``one-pass`` asked for a length-dependent rope type, where it would be wrong.
    """
    if settings.stride is not None:
        return "sliding"
    dynamic = loaded.rope.rope_type in LENGTH_DEPENDENT_TYPES
    if settings.mode == "one-pass" and dynamic:
        raise InputError(
            f"one-pass scoring is wrong for rope type {loaded.rope.rope_type}: its frequencies depend on the "
            "input length. Use mode per-length (the default for it)."
        )
    if settings.mode != "auto":
        return settings.mode
    return "per-length" if dynamic else "one-pass"


def evaluate_perplexity(
    loaded: LoadedModel,
    texts: Sequence[str] | Any | None = None,
    settings: PerplexitySettings | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Perplexity of one model by length, by position bucket, and by context limit.

    Args:
        loaded: the model.
        texts: document texts (default: read from ``settings.data``).
        settings: lengths, buckets, stride, context limits … (default: the declared defaults); relative
            lengths (``"2x"``, ``"target"``) are resolved against this model's contexts.
        show_progress: draw a progress bar with ETA.

    Returns:
        The ``perplexity`` section of a report for this model (its schema: :mod:`.schema`).

    Raises:
        InputError: bad settings, lengths beyond the model's context, or no document long enough.
    """
    settings = (settings or PerplexitySettings()).resolved(loaded.original_length, loaded.context_length)
    settings.check()
    if texts is None:
        from ctxext.scoring.texts import iter_texts

        texts = iter_texts(settings.data, settings.text_field, settings.split)
    started = time.perf_counter()
    requested = settings.token_lengths()
    short_len = loaded.original_length if settings.short_context else None
    lengths = sorted(set(requested) | ({short_len} if short_len else set()))
    beyond = check_lengths(loaded, requested, settings.allow_beyond_context)
    longest = requested[-1]
    docs = _select_documents(texts, loaded.tokenizer, lengths[0], longest, settings)
    mode = choose_mode(loaded, settings)
    model = loaded.model
    dynamic = loaded.rope.rope_type in LENGTH_DEPENDENT_TYPES
    scores = _Scores(by_length={L: ([], [], []) for L in lengths})
    if mode == "sliding":
        _run_sliding(model, docs, lengths, longest, settings, scores, dynamic, show_progress, loaded.name)
    elif mode == "one-pass":
        _run_one_pass(model, docs, lengths, longest, settings, scores, show_progress, loaded.name)
    else:
        _run_per_length(model, docs, lengths, longest, settings, scores, dynamic, show_progress, loaded.name)

    res = settings.resamples
    common = set(scores.full_docs)
    by_length, by_length_all = _length_tables(scores, requested, beyond, common, settings)
    result: dict[str, Any] = {
        "protocol": SLIDING_PROTOCOL if mode == "sliding" else PPL_PROTOCOL,
        "mode": mode,
        "document_set": "common",
        "by_length": by_length,
        "by_length_all": by_length_all,
        "by_bucket": [],
        "bucket_length": longest,
        "bucket_documents": len(scores.full),
        "documents": {
            "read": docs.read,
            "too_short": docs.too_short,
            "min_tokens": docs.min_tokens,
            "evaluated": len(docs.ids),
            "common": len(common),
            "per_length": {str(L): len(scores.by_length[L][1]) for L in lengths},
        },
        "settings": _settings_dict(settings),
        "forward_passes": scores.passes,
        "tokens_processed": scores.tokens_processed,
    }
    if short_len:
        result["short_context"] = {"length": short_len, **_common_entry(scores, short_len, common, settings)}
    bucket = settings.bucket_size if isinstance(settings.bucket_size, int) else None  # resolved: never "auto"
    if bucket and mode != "sliding":
        result["by_bucket"] = _buckets(scores.full, longest, bucket, res, settings.seed)
    result["per_document"] = _per_document(docs, scores, longest, bucket, mode)
    if settings.context_limits:
        # k = the original window is always on the curve: its paired gain answers "does the model use
        # context beyond its original window?".
        original = loaded.original_length
        limits = sorted(set(settings.context_limits) | ({original} if 2 <= original < longest else set()))
        result["context_use"] = _context_use(
            model, scores.full, scores.full_ids, longest, settings, limits, dynamic, show_progress, loaded.name
        )
        result["context_use"]["original_window"] = original if original in limits else None
    result["seconds"] = round(time.perf_counter() - started, 3)
    return result


def _select_documents(
    texts: Sequence[str] | Any, tokenizer: Any, shortest: int, longest: int, settings: PerplexitySettings
) -> Documents:
    # Every length is scored on the documents reaching the longest one (the common set): too few is an error.
    docs = tokenize_documents(texts, tokenizer, shortest, settings.max_docs, longest)
    if not docs.ids:
        raise too_short_error(docs, shortest, "the shortest length", settings.min_docs)
    if sum(len(d) >= longest for d in docs.ids) < settings.min_docs:
        raise too_short_error(docs, longest, "the longest length; every length uses these", settings.min_docs)
    return docs


def _common_entry(scores: _Scores, L: int, common: set[int], settings: PerplexitySettings) -> dict[str, Any]:
    # The perplexity at L over the common document set only.
    sums, counts, idx = scores.by_length[L]
    keep = [j for j, d in enumerate(idx) if d in common]
    return ppl_entry(np.array(sums)[keep], np.array(counts)[keep], settings.resamples, settings.seed)


def _length_tables(
    scores: _Scores, requested: list[int], beyond: Sequence[int], common: set[int], settings: PerplexitySettings
) -> tuple[dict[str, Any], dict[str, Any]]:
    # by_length: the common document set at every length; by_length_all: every document reaching each length.
    by_length, by_length_all = {}, {}
    for L in requested:
        sums, counts, _ = scores.by_length[L]
        entry = _common_entry(scores, L, common, settings)
        entry_all = ppl_entry(np.array(sums), np.array(counts), settings.resamples, settings.seed)
        entry["beyond_context"] = entry_all["beyond_context"] = L in beyond
        by_length[str(L)] = entry
        by_length_all[str(L)] = entry_all
    return by_length, by_length_all


def _settings_dict(settings: PerplexitySettings) -> dict[str, Any]:
    return settings.model_dump()


def _record(scores: _Scores, L: int, nll: torch.Tensor, doc: int) -> None:
    # nll[t - 1] is the NLL of token t; length L scores tokens 1..L-1.
    sums, counts, docs = scores.by_length[L]
    sums.append(float(nll[: L - 1].double().sum()))
    counts.append(L - 1)
    docs.append(doc)


def _run_one_pass(model, docs, lengths, longest, settings, scores, show, name) -> None:
    # One pass at the longest evaluation length each document reaches; shorter lengths are its prefixes.
    plan = []
    for d in docs.ids:
        reach = [L for L in lengths if L <= len(d)]
        plan.append((d, reach[-1]))
    total = sum(r for _, r in plan)
    with progress(f"ppl {name} (one pass per document)", total, enabled=show) as advance:
        for i, (d, reach) in enumerate(plan):
            nll = token_nll(model, d[None, :reach], 1, settings.chunk_size)[0]
            scores.passes += 1
            scores.tokens_processed += reach
            for L in lengths:
                if L <= reach:
                    _record(scores, L, nll, i)
            if reach >= longest:
                scores.full_docs.append(i)
                scores.full.append(nll[: longest - 1].clone())
                scores.full_ids.append(d[:longest])
            advance(reach)


def _run_per_length(model, docs, lengths, longest, settings, scores, dynamic, show, name) -> None:
    total = sum(L for L in lengths for d in docs.ids if len(d) >= L)
    with progress(f"ppl {name} (one pass per length)", total, enabled=show) as advance:
        for L in lengths:
            for i, d in enumerate(docs.ids):
                if len(d) < L:
                    continue
                # Dynamic NTK keeps the frequencies of the longest sequence seen: reset before each pass.
                reset_dynamic_rope(model)
                nll = token_nll(model, d[None, :L], 1, settings.chunk_size)[0]
                scores.passes += 1
                scores.tokens_processed += L
                _record(scores, L, nll, i)
                if L == longest:
                    scores.full_docs.append(i)
                    scores.full.append(nll.clone())
                    scores.full_ids.append(d[:longest])
                advance(L)
    if dynamic:
        reset_dynamic_rope(model)


def _run_sliding(model, docs, lengths, longest, settings, scores, dynamic, show, name) -> None:
    cap = settings.max_doc_tokens
    stride = int(settings.stride)
    total = sum(min(len(d), cap or len(d)) for d in docs.ids) * len(lengths)
    with progress(f"ppl {name} (sliding window, stride {stride})", total, enabled=show) as advance:
        for L in lengths:
            sums, counts, doc_idx = scores.by_length[L]
            for i, d in enumerate(docs.ids):
                if len(d) < L:
                    continue
                ids = d[:cap] if cap else d
                nll = sliding_nll(
                    model, ids, L, stride, settings.chunk_size, settings.batch_tokens, dynamic, lambda a: advance(a)
                )
                n_win = len(sliding_windows(len(ids), L, stride))
                scores.passes += n_win
                scores.tokens_processed += sum(w.end - w.begin for w in sliding_windows(len(ids), L, stride))
                sums.append(float(nll.double().sum()))
                counts.append(int(nll.numel()))
                doc_idx.append(i)
                if L == longest:
                    scores.full_docs.append(i)
                    scores.full.append(nll[: longest - 1].clone())
                    scores.full_ids.append(d[:longest])
    if dynamic:
        reset_dynamic_rope(model)


def _per_document(docs: Documents, scores: _Scores, longest: int, bucket: int | None, mode: str) -> dict[str, Any]:
    # What paired comparisons need: per-document NLL sums, keyed by content so that two models' reports
    # pair the same documents (and refuse to pair when their tokenizers differ).
    common = set(scores.full_docs)

    def view(only_common: bool) -> dict[str, Any]:
        out = {}
        for L, (sums, counts, idx) in scores.by_length.items():
            keep = [j for j, d in enumerate(idx) if d in common or not only_common]
            out[str(L)] = {
                "docs": [idx[j] for j in keep],
                "nll_sums": [sums[j] for j in keep],
                "tokens": [counts[j] for j in keep],
            }
        return out

    out: dict[str, Any] = {
        "keys": [document_key(d) for d in docs.ids],
        "by_length": view(True),  # the common set: what the main table and the paired comparisons use
        "by_length_all": view(False),
    }
    if bucket and mode != "sliding" and scores.full:
        mat = torch.stack([v[: longest - 1] for v in scores.full]).double().numpy()
        edges = [(start, start + bucket) for start in range(0, longest, bucket)]
        out["buckets"] = {
            "docs": list(scores.full_docs),
            "edges": [list(e) for e in edges],
            "nll_sums": [mat[:, max(a, 1) - 1 : b - 1].sum(axis=1).tolist() for a, b in edges],
            "tokens": [b - max(a, 1) for a, b in edges],
        }
    return out


def _buckets(full: list[torch.Tensor], longest: int, size: int, resamples: int, seed: int) -> list[dict[str, Any]]:
    if not full:
        return []
    # Column t - 1 holds the NLL of the token at position t.
    mat = torch.stack([v[: longest - 1] for v in full]).double().numpy()
    out = []
    for start in range(0, longest, size):
        end = start + size
        lo, hi = max(start, 1), end  # position 0 (BOS / first token) is never predicted
        block = mat[:, lo - 1 : hi - 1]
        sums = block.sum(axis=1)
        counts = np.full(len(sums), block.shape[1])
        out.append({"start": start, "end": end, **ppl_entry(sums, counts, resamples, seed)})
    return out


def _context_use(model, full, full_ids, longest, settings, limits, dynamic, show, name) -> dict[str, Any]:
    first = limits[-1]
    if not full:
        return {}
    n_targets = longest - first
    ref_sums = np.array([float(v[first - 1 : longest - 1].double().sum()) for v in full])
    counts = np.full(len(full), n_targets)
    out: dict[str, Any] = {
        "targets": {"start": first, "end": longest, "tokens_per_document": n_targets, "documents": len(full)},
        "full": ppl_entry(ref_sums, counts, settings.resamples, settings.seed),
        "limits": [],
    }
    total = len(full) * len(limits) * (longest - 1)
    with progress(f"context use {name}", total, enabled=show) as advance:
        for k in limits:
            sums = []
            for d in full_ids:
                nll = sliding_nll(
                    model,
                    d,
                    k,
                    max(1, k // 2),
                    settings.chunk_size,
                    settings.batch_tokens,
                    dynamic,
                    lambda a: advance(a),
                )
                sums.append(float(nll[first - 1 : longest - 1].double().sum()))
            sums_a = np.array(sums)
            entry = ppl_entry(sums_a, counts, settings.resamples, settings.seed)
            low, high = bootstrap_mean_diff(sums_a, ref_sums, counts, settings.resamples, settings.seed)
            gain = float((sums_a.sum() - ref_sums.sum()) / counts.sum())
            entry.update(
                {
                    "context": k,
                    "stride": max(1, k // 2),
                    "gain_nll": gain,
                    "gain_nll_ci_low": low,
                    "gain_nll_ci_high": high,
                    "ppl_ratio": math.exp(gain),
                }
            )
            out["limits"].append(entry)
    return out
