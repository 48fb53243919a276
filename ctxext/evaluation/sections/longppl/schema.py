"""The ``longppl`` section's results in ``report.json``: perplexity on the key tokens and on every token, per length."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ctxext.artifacts.report import PplEntry, Section


class LongPPLLength(Section):
    """LongPPL at one length: perplexity on the key tokens, plain perplexity on every token, how many were key."""

    longppl: PplEntry
    ppl: PplEntry
    key_tokens: int
    scored_tokens: int
    key_fraction: float | None = None
    evaluator_mean_lsd: float | None = None
    beyond_context: bool = False
    note: str | None = None


class LongPPL(Section):
    """The ``longppl`` section: perplexity on the tokens that need the far context (Fang et al. 2024).

    ``evaluator``: the model that chose the key tokens (the same tokens for every model of the report);
    ``by_length`` is empty, with a ``note``, for a model that could not be scored on them.
    """

    definition: str | None = None
    evaluator: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    by_length: dict[str, LongPPLLength] = Field(default_factory=dict)
    per_document: dict[str, Any] | None = None
    note: str | None = None
