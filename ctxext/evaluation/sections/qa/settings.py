"""The ``qa:`` section's settings, declared once (the flags of ``ctxext eval qa``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ctxext.evaluation.lengths import Length, resolve_length
from ctxext.evaluation.settings import CHAT_HELP, check_chat_choice, checked_lengths

QA_TEMPLATE = "{context}\n\nQuestion: {question}\nAnswer:"


class QASettings(BaseModel):
    """A long-document QA evaluation: greedy answers, SQuAD EM / F1 by answer position and context length."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    data: str = Field(description="jsonl / json / parquet / csv file or Hub data set")
    context_field: str = Field(default="context", description="column with the document")
    question_field: str = Field(default="question", description="column with the question")
    answers_field: str = Field(default="answers", description="column with the answer(s)")
    split: str = Field(default="test", description="split of a Hub data set")
    max_examples: int | None = Field(default=None, gt=0, description="at most this many examples (none: all)")
    max_length: Length | None = Field(
        default=None, description="prompt budget: tokens, Nx (× the original context) or target (none: the context)"
    )
    max_new_tokens: int = Field(default=32, gt=0, description="answer budget in tokens")
    template: str = Field(default=QA_TEMPLATE, description="prompt template with {context} and {question}")
    chat_template: str = Field(default="auto", description=CHAT_HELP)
    length_edges: list[int] = Field(
        default_factory=lambda: [4000, 8000], description="context-length bucket edges in tokens (LongBench-E)"
    )

    @field_validator("max_length")
    @classmethod
    def _max_length(cls, value: Length | None) -> Length | None:
        return value if value is None else checked_lengths([value])[0]

    @field_validator("chat_template")
    @classmethod
    def _chat_template(cls, value: str, info: ValidationInfo) -> str:
        return check_chat_choice(value, info)

    def prompt_length(self, original: int, context: int) -> int:
        """The prompt budget in tokens for a model with these contexts (its configured context by default)."""
        return context if self.max_length is None else resolve_length(self.max_length, original, context)
