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
* a model's own key tokens: ``LSD > α`` **and** ``LCL > β`` under its own scores, with the paper's
  ``α = 2``, ``β = −2`` (nats) by default;
* the scored key tokens are the same for every model of a report (paired): by default the **union** of every
  model's own key tokens, so the set does not depend on the order the models are listed in and no model is
  scored only on the tokens it picked itself; with ``evaluator:`` one model of the run picks them, and that
  model is reported but not compared (its own LongPPL is selection-biased low: ``LCL > β`` bounds it);
* LongPPL aggregates over documents as the reference code does: the per-document ``exp(mean key NLL)``
  averaged with key-token weights (plain perplexity likewise, with token weights); ``exp`` of the pooled mean
  NLL is reported beside it (``*_pooled``); 95 % bootstrap intervals over documents.

The selection is per token within a document, so a document resampled by the bootstrap carries exactly the
key tokens the rule picks in it: resampling documents re-runs the selection. What the bootstrap cannot see is
selection bias (a model scored on tokens chosen because it predicts them well), which is why no compared model
picks the tokens alone.
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
    "lsd_threshold and LCL = log P(long) > lcl_threshold; short context: windows of K + S tokens moved by S (each "
    "token sees K to K + S - 1 tokens); key tokens: the union of every model's own (or one named evaluator's), the "
    "same for every model; corpus value: per-document LongPPL averaged with key-token weights (the reference code's)"
)
UNION = "union"
EVALUATOR = "evaluator"


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
    """One model's full-context NLLs (per length, per document), its short-context NLLs if it picks key tokens."""

    doc_keys: list[str]
    nll: dict[int, list[Any]]
    context: int
    short: dict[int, list[Any]] | None = None


@dataclass
class LongPPLRun:
    """The state of one suite run: settings resolved, who picks the key tokens, every model's scores.

    Attributes:
        short_context: ``K`` in tokens.
        stride: ``S`` in tokens.
        evaluator: the named evaluator's label; ``None``: every model picks (the union of their key tokens).
        context: the reference model's configured context.
        keys: per length, the scored key positions of each document (set by :func:`select_keys`).
        selectors: the models whose key tokens were used.
        own: per selector and length, ``{"key_tokens", "mean_lsd"}`` of its own selection.
        models: scores by model label.
        lengths: the evaluation lengths in tokens (set by the first model scored).
    """

    short_context: int
    stride: int
    evaluator: str | None
    context: int
    keys: dict[int, list[Any]] = field(default_factory=dict)
    selectors: list[str] = field(default_factory=list)
    own: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    models: dict[str, ModelScores] = field(default_factory=dict)
    lengths: list[int] = field(default_factory=list)

    def picks(self, name: str) -> bool:
        """Whether ``name``'s own key tokens enter the scored set (every model's, or the named evaluator's)."""
        return self.evaluator is None or self.evaluator == name


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
            "(add the evaluator with --model and name it by its label, or leave it unset: the union of every "
            "model's key tokens)"
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
    """Score one model: full-context NLLs of every document at every length, short-context ones if it picks keys.

    The results stay in ``run`` until :func:`select_keys` and :func:`model_result` (after every model).
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
    picks = run.picks(loaded.name)
    window, stride = run.short_context + run.stride, run.stride

    def full(ids: Any) -> Any:
        reset_dynamic_rope(loaded.model)
        return token_nll(loaded.model, ids[None])[0]

    def short(ids: Any) -> Any:
        return sliding_nll(loaded.model, ids, window, stride, reset_rope=dynamic)

    nll: dict[int, list[Any]] = {L: [] for L in lengths}
    short_nll: dict[int, list[Any]] = {L: [] for L in lengths}
    with progress(f"longppl {loaded.name}", len(docs) * (2 if picks else 1), enabled=show) as advance:
        for doc in docs:
            for L, v in _by_length(full, doc, lengths, dynamic).items():
                nll[L].append(v)
            advance(1)
            if picks:
                for L, v in _by_length(short, doc, lengths, dynamic).items():
                    short_nll[L].append(v)
                advance(1)
    reset_dynamic_rope(loaded.model)
    keys = [document_key(d) for d in docs]
    run.models[loaded.name] = ModelScores(keys, nll, loaded.context_length, short_nll if picks else None)


def _paired_group(run: LongPPLRun) -> list[str]:
    # The models scored on one token split of the documents (key tokens are paired by position): the named
    # evaluator's, or the largest group of models that split them alike (ties: the first model's group).
    names = list(run.models)
    if run.evaluator is not None:
        anchor = run.evaluator
    else:
        anchor = max(names, key=lambda n: sum(run.models[m].doc_keys == run.models[n].doc_keys for m in names))
    return [n for n in names if run.models[n].doc_keys == run.models[anchor].doc_keys]


def select_keys(run: LongPPLRun, settings: LongPPLSettings) -> None:
    """The scored key tokens: per length and document, the union of the selectors' own key positions.

    A selector is every model that split the documents like the others (or only the named evaluator); each
    picks on its own long and short scores. The union does not depend on the models' order.
    """
    import torch

    first = run.short_context + run.stride  # tokens before K + S saw their whole prefix in both scorings
    group = _paired_group(run) if run.models else []
    run.selectors = [n for n in group if run.picks(n) and run.models[n].short is not None]
    for L in run.lengths:
        n_docs = len(run.models[group[0]].nll[L]) if group else 0
        union: list[set[int]] = [set() for _ in range(n_docs)]
        for name in run.selectors:
            scores = run.models[name]
            assert scores.short is not None  # selectors scored short windows (see score_model)
            pairs = list(zip(scores.nll[L], scores.short[L], strict=True))
            own = [select_key_tokens(a, b, settings.lsd_threshold, settings.lcl_threshold) for a, b in pairs]
            for doc, positions in zip(union, own, strict=True):
                doc.update(positions.tolist())
            gain = sum(float((b[first - 1 :] - a[first - 1 :]).double().sum()) for a, b in pairs)
            candidates = len(pairs) * max(0, L - first)
            run.own.setdefault(name, {})[L] = {
                "key_tokens": int(sum(len(k) for k in own)),
                "mean_lsd": gain / candidates if candidates else math.nan,
            }
        run.keys[L] = [torch.tensor(sorted(doc), dtype=torch.long) for doc in union]


def _length_entry(scores: ModelScores, keys: list[Any], L: int, settings: LongPPLSettings) -> tuple[dict, dict]:
    # One length of one model: the report entry and the per-document sums it was computed from.
    from ctxext.scoring.stats import doc_ppl_entry, ppl_entry

    key_sums = np.array([float(v[k - 1].double().sum()) for v, k in zip(scores.nll[L], keys, strict=True)])
    key_counts = np.array([len(k) for k in keys])
    sums = np.array([float(v.double().sum()) for v in scores.nll[L]])
    counts = np.array([len(v) for v in scores.nll[L]])
    scored = int(counts.sum())
    # Documents without a key token have no LongPPL (the reference code skips them too).
    has = key_counts > 0
    r, seed = settings.resamples, settings.seed
    entry = {
        "longppl": doc_ppl_entry(key_sums[has], key_counts[has], r, seed),
        "longppl_pooled": ppl_entry(key_sums[has], key_counts[has], r, seed),
        "ppl": doc_ppl_entry(sums, counts, r, seed),
        "ppl_pooled": ppl_entry(sums, counts, r, seed),
        "key_tokens": int(key_counts.sum()),
        "scored_tokens": scored,
        "key_fraction": float(key_counts.sum()) / scored if scored else None,
        "beyond_context": L > scores.context,
    }
    per_doc = {
        "key_nll_sums": key_sums.tolist(),
        "key_tokens": key_counts.tolist(),
        "nll_sums": sums.tolist(),
        "tokens": counts.tolist(),
        "key_positions": [k.tolist() for k in keys],
    }
    return entry, per_doc


def model_result(name: str, settings: LongPPLSettings, run: LongPPLRun) -> dict[str, Any]:
    """The ``longppl`` section of one model's report entry (after :func:`select_keys`)."""
    scores = run.models[name]
    out: dict[str, Any] = {
        "definition": DEFINITION,
        "key_selection": EVALUATOR if run.evaluator else UNION,
        "evaluator": run.evaluator,
        "selectors": list(run.selectors),
        "settings": {
            **settings.model_dump(),
            "lengths": run.lengths,
            "short_context": run.short_context,
            "stride": run.stride,
        },
        "by_length": {},
    }
    if not run.selectors:
        out["note"] = "not scored: no model picked key tokens"
        return out
    if scores.doc_keys != run.models[run.selectors[0]].doc_keys:
        out["note"] = (
            f"not scored: {name}'s tokenizer splits the documents differently from {', '.join(run.selectors)}; "
            "key tokens are paired by position"
        )
        return out
    if name == run.evaluator:
        out["selection_biased"] = True  # it chose the tokens it is scored on: reported, not compared
    per_doc: dict[str, Any] = {}
    first = run.short_context + run.stride
    for L in run.lengths:
        entry, per_doc[str(L)] = _length_entry(scores, run.keys[L], L, settings)
        own = run.own.get(name, {}).get(L)
        if own is not None:
            entry.update(own_key_tokens=own["key_tokens"], mean_lsd=own["mean_lsd"])
        if L <= first:  # every token's short window is its whole prefix
            entry["note"] = "no candidate token: the length is within K + S"
        out["by_length"][str(L)] = entry
    out["per_document"] = {"keys": scores.doc_keys, "by_length": per_doc}
    return out
