"""The ``longppl`` section's results in ``report.json``: perplexity on the key tokens and on every token, per length."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ctxext.artifacts.report import PplEntry, Section


class LongPPLLength(Section):
    """LongPPL at one length: perplexity on the key tokens, plain perplexity on every token, how many were key.

    ``longppl`` and ``ppl`` aggregate over documents as LongPPL's reference code does (per-document perplexities
    averaged with key-token / token weights; their ``nll`` is the log of that value); ``longppl_pooled`` and
    ``ppl_pooled`` are ``exp`` of the pooled mean NLL (lower, by Jensen's inequality). ``own_key_tokens`` and
    ``mean_lsd``: this model's own selection (the tokens it alone would call key, its mean gain over the candidate
    tokens), when it picked. ``evaluator_mean_lsd``: reports written before the union selection.
    """

    longppl: PplEntry
    ppl: PplEntry
    longppl_pooled: PplEntry | None = None
    ppl_pooled: PplEntry | None = None
    key_tokens: int
    scored_tokens: int
    key_fraction: float | None = None
    own_key_tokens: int | None = None
    mean_lsd: float | None = None
    evaluator_mean_lsd: float | None = None
    beyond_context: bool = False
    note: str | None = None


class LongPPL(Section):
    """The ``longppl`` section: perplexity on the tokens that need the far context (Fang et al. 2024).

    ``key_selection``: ``union`` (every model's own key tokens, joined: the default) or ``evaluator`` (one named
    model picked them; its own entry is ``selection_biased`` and not compared); ``selectors``: the models whose
    picks were used. The scored key tokens are the same for every model of the report; ``by_length`` is empty,
    with a ``note``, for a model that could not be scored on them.
    """

    definition: str | None = None
    key_selection: str | None = None
    evaluator: str | None = None
    selectors: list[str] = Field(default_factory=list)
    selection_biased: bool = False
    settings: dict[str, Any] = Field(default_factory=dict)
    by_length: dict[str, LongPPLLength] = Field(default_factory=dict)
    per_document: dict[str, Any] | None = None
    note: str | None = None
