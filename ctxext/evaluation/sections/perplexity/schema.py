"""The ``perplexity`` section's results in ``report.json``: by evaluation length, by token position, by context limit.

Registered with the report schema by the section (:class:`~ctxext.evaluation.sections.base.SuiteSection` ``schema``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ctxext.artifacts.report import PplEntry, Section


class PplLength(PplEntry):
    """Perplexity at one evaluation length; ``beyond_context``: the length is past the model's context."""

    beyond_context: bool = False


class PplBucket(PplEntry):
    """Perplexity of the tokens at positions ``start`` (included) to ``end`` (excluded)."""

    start: int
    end: int


class ShortContext(PplEntry):
    """Perplexity at the model's original context length (the cost of the extension inside it)."""

    length: int


class ContextUse(Section):
    """The same target tokens scored with their context cut to k tokens (``limits``) and in full."""

    targets: dict[str, Any]
    full: PplEntry
    limits: list[dict[str, Any]] = Field(default_factory=list)
    original_window: int | None = None


class PplDocuments(Section):
    """How many documents were read, skipped as too short, and evaluated."""

    read: int | None = None
    too_short: int | None = None
    min_tokens: int | None = None
    evaluated: int | None = None
    common: int | None = None
    per_length: dict[str, int] = Field(default_factory=dict)


class Perplexity(Section):
    """The ``perplexity`` section of a model: by evaluation length, by token position, by context limit."""

    protocol: str | None = None
    mode: str | None = None
    document_set: str | None = None
    by_length: dict[str, PplLength]
    by_length_all: dict[str, PplLength] = Field(default_factory=dict)
    per_document: dict[str, Any] | None = None
    by_bucket: list[PplBucket] = Field(default_factory=list)
    bucket_length: int | None = None
    bucket_documents: int | None = None
    short_context: ShortContext | None = None
    context_use: ContextUse | None = None
    documents: PplDocuments = Field(default_factory=PplDocuments)
    settings: dict[str, Any] = Field(default_factory=dict)

    def ppl_at(self, length: int) -> float | None:
        """The perplexity at an evaluation length, if measured."""
        entry = self.by_length.get(str(length))
        return entry.ppl if entry else None
