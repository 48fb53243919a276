"""The ``qa`` section's results in ``report.json``: SQuAD exact match / F1 overall, by answer position and length."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ctxext.artifacts.report import Percent, Section


class QAScores(Section):
    """SQuAD exact match and F1 (percent) over some examples, with 95 % bootstrap intervals."""

    examples: int = Field(ge=0)
    exact_match: Percent = None
    f1: Percent = None
    exact_match_ci: list[float | None] = Field(default_factory=list)
    f1_ci: list[float | None] = Field(default_factory=list)


class QA(Section):
    """The ``qa`` section: long-document QA overall, by answer position and by context length."""

    examples: int
    truncated: int = 0
    prompt_budget: int | None = None
    overall: QAScores
    by_position: dict[str, QAScores] = Field(default_factory=dict)
    by_length: dict[str, QAScores] = Field(default_factory=dict)
    samples: list[dict[str, Any]] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict)
    chat_template: str | None = None
    chat_template_reason: str | None = None
