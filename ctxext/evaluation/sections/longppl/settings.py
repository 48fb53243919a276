"""The ``longppl:`` section's settings, declared once (the flags of ``ctxext eval longppl``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ctxext.evaluation.lengths import Length
from ctxext.evaluation.settings import MIN_DOCS
from ctxext.scoring.stats import DEFAULT_RESAMPLES

_TARGET: list[Length] = ["target"]  # typed (a bare lambda's list literal would be list[str])


class LongPPLSettings(BaseModel):
    """The ``longppl:`` section of a suite (its keys, defaults and help, declared once)."""

    model_config = ConfigDict(extra="forbid")

    data: str = Field(
        default="builtin:stdlib-long", description="documents: text file, folder, jsonl/parquet, Hub id, builtin:"
    )
    text_field: str = Field(default="text", description="text column of table-like data")
    split: str = Field(default="test", description="split of a Hub data set")
    lengths: list[Length] = Field(
        default_factory=_TARGET.copy, description="evaluation lengths (documents truncated to each)"
    )
    short_context: Length = Field(
        default="1x", description="K: the short context, in tokens or relative ('1x' = the original window)"
    )
    stride: int | None = Field(
        default=None, gt=0, description="S: short windows of K + S tokens move by S (default K / 4, the paper's)"
    )
    lsd_threshold: float = Field(default=2.0, ge=0, description="alpha: least long-short log-prob gain (nats)")
    lcl_threshold: float = Field(default=-2.0, le=0, description="beta: least long-context log-prob (nats)")
    evaluator: str | None = Field(
        default=None,
        description="label of a model of the run that alone picks the key tokens, reported but not compared "
        "(default: the union of every model's own key tokens)",
    )
    max_docs: int = Field(default=20, gt=0, description="documents reaching the longest length")
    min_docs: int = Field(default=MIN_DOCS, gt=0, description="fewest documents (a bootstrap interval needs several)")
    resamples: int = Field(default=DEFAULT_RESAMPLES, gt=0, description="bootstrap resamples for the 95% CIs")
    seed: int = Field(default=0, description="bootstrap seed")
