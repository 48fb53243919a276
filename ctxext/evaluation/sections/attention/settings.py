"""The ``attention:`` section's settings, declared once (the flags of ``ctxext eval attention``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ctxext.evaluation.lengths import Length
from ctxext.evaluation.settings import checked_lengths

# Typed default (a bare lambda's list literal would be inferred as list[int]).
_ATTENTION_BANDS: list[float] = [0.01, 0.1, 0.5]


class AttentionTask(BaseModel):
    """Attention diagnostics (mass by distance band, beyond the original window, sinks, entropy)."""

    model_config = ConfigDict(extra="forbid")

    data: str = Field(
        default="builtin:stdlib", description="documents: text file, folder, jsonl/parquet/csv, Hub id, builtin:NAME"
    )
    text_field: str = Field(default="text", description="text column of table-like data")
    split: str = Field(default="test", description="split of a Hub data set")
    length: Length = Field(
        default="target", description="tokens per document: tokens, Nx (× the original context), target"
    )
    docs: int = Field(default=4, gt=0, description="documents (each reaching the length)")
    bands: list[float] = Field(
        default_factory=_ATTENTION_BANDS.copy, description="distance band edges as fractions of the length"
    )
    sink_tokens: int = Field(default=4, gt=0, description="first tokens counted as attention sinks")
    allow_beyond_context: bool = Field(
        default=False,
        description="measure at a length above a model's context (marked †) instead of failing: how an unextended "
        "model attends past its window",
    )

    @field_validator("length")
    @classmethod
    def _length(cls, value: Length) -> Length:
        return checked_lengths([value])[0]

    @field_validator("bands")
    @classmethod
    def _bands(cls, values: list[float]) -> list[float]:
        # Checked where declared: a bad band fails as a suite key and as a flag, before any model loads.
        if sorted(values) != list(values) or any(not 0 < b < 1 for b in values):
            raise ValueError(f"{values}: increasing fractions strictly between 0 and 1")
        return values
