"""The ``perplexity:`` section's settings, declared once (torch-free: the command line builds its flags here).

:class:`PerplexitySettings` is *the* declaration of a perplexity evaluation: the ``perplexity:`` section of
a suite, the flags of ``ctxext eval ppl`` (generated from its fields, :mod:`ctxext.recipe.flags`) and the
argument of :func:`ctxext.evaluation.sections.perplexity.engine.evaluate_perplexity`. Its field defaults are the
only defaults, so ``ctxext eval ppl`` and ``ctxext eval run`` read the same documents unless told otherwise.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ctxext.errors import InputError
from ctxext.evaluation.lengths import Length, resolve_length
from ctxext.evaluation.settings import DEFAULT_LENGTHS, MIN_DOCS, checked_lengths
from ctxext.scoring.stats import DEFAULT_RESAMPLES

# How the report describes a perplexity run (older reports without the key read as the truncated protocol).
PPL_PROTOCOL = (
    "truncated-document perplexity: each document tokenized with the tokenizer's defaults (BOS where it adds "
    "one) and cut to L tokens; token t is predicted from tokens < t; every length and bucket over the same "
    "documents (those reaching the longest length; 'all documents >= L' as a secondary view); 95% bootstrap CI "
    "over documents"
)
SLIDING_PROTOCOL = (
    "strided sliding window (transformers docs): whole documents, windows of L tokens moved by the stride, each "
    "token scored once from its window; 95% bootstrap CI over documents"
)
# Position buckets beyond this many would make a table (and a bootstrap per bucket) of little use.
MAX_BUCKETS = 1024


def auto_bucket(longest: int) -> int:
    """The ``bucket_size: auto`` of a longest length: an eighth of it (or the largest of ½, ¼ that divides it)."""
    for parts in (8, 4, 2, 1):
        if longest % parts == 0:
            return longest // parts
    return longest


class PerplexitySettings(BaseModel):
    """Perplexity by length, by position bucket and by context limit, on documents truncated to each length."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    data: str = Field(
        default="builtin:stdlib", description="documents: text file, folder, jsonl/parquet/csv, Hub id, builtin:NAME"
    )
    text_field: str = Field(default="text", description="text column of table-like data")
    split: str = Field(default="test", description="split of a Hub data set")
    lengths: list[Length] = Field(
        default_factory=DEFAULT_LENGTHS.copy,
        min_length=1,
        description="evaluation lengths: tokens, Nx (× the original context), target, Nx target",
    )
    bucket_size: int | Literal["auto"] | None = Field(
        default="auto", description="position bucket width: tokens dividing the longest length, auto (longest/8), none"
    )
    context_limits: list[Length] = Field(
        default_factory=list, description="context-use curve: limits k below the longest length, e.g. 32,128"
    )
    stride: int | None = Field(default=None, gt=0, description="sliding-window mode: windows moved by this many tokens")
    max_docs: int | None = Field(
        default=20, gt=0, description="documents reaching the longest length (the common set all lengths use)"
    )
    min_docs: int = Field(default=MIN_DOCS, gt=0, description="fewest documents a perplexity may average")
    max_doc_tokens: int | None = Field(default=None, gt=0, description="sliding-window mode: cut documents to this")
    chunk_size: int | None = Field(
        default=None, gt=0, description="positions projected onto the vocabulary at once (none: 256 CPU, 2048 GPU)"
    )
    batch_tokens: int = Field(default=16384, gt=0, description="tokens per batched forward pass of short windows")
    resamples: int = Field(default=DEFAULT_RESAMPLES, gt=0, description="bootstrap resamples for the 95% CIs")
    seed: int = Field(default=0, description="bootstrap seed")
    short_context: bool = Field(default=True, description="also report perplexity at the original context")
    allow_beyond_context: bool = Field(
        default=False,
        description="keep relative lengths (2x) above the reference model's context instead of dropping them; lengths "
        "above a model's context are marked †",
    )
    mode: Literal["auto", "one-pass", "per-length"] = Field(
        default="auto",
        description="auto (one pass for static RoPE, one per length for dynamic/longrope), one-pass, per-length",
    )

    @field_validator("bucket_size", mode="before")
    @classmethod
    def _bucket(cls, value: object) -> object:
        # "none" on the command line, null in YAML: no buckets.
        return None if isinstance(value, str) and value.strip().lower() in ("none", "null") else value

    @field_validator("lengths", "context_limits")
    @classmethod
    def _lengths(cls, values: list[Length]) -> list[Length]:
        return checked_lengths(values)

    def resolved(self, original: int, context: int) -> PerplexitySettings:
        """A copy with lengths and context limits in tokens (sorted, unique) and ``auto`` buckets sized.

        Args:
            original: the original (pretraining) context relative lengths refer to.
            context: the configured context (``target``).
        """
        lengths = sorted({resolve_length(x, original, context) for x in self.lengths})
        limits = sorted({resolve_length(x, original, context) for x in self.context_limits})
        bucket = auto_bucket(lengths[-1]) if self.bucket_size == "auto" else self.bucket_size
        update = {"lengths": lengths, "context_limits": limits, "bucket_size": bucket}
        return self.model_copy(update=update)

    def token_lengths(self) -> list[int]:
        """The lengths of :meth:`resolved` settings (raises if one is still relative)."""
        if not all(isinstance(x, int) for x in [*self.lengths, *self.context_limits]):
            raise InputError("perplexity lengths must be resolved to token counts first (PerplexitySettings.resolved)")
        return [int(x) for x in self.lengths]

    def check(self) -> None:
        """Raise :class:`InputError` for resolved settings that cannot give sensible numbers."""
        lengths = self.token_lengths()
        if lengths[0] < 2:
            raise InputError(
                f"--lengths (perplexity.lengths in a suite): each length must be at least 2 tokens, got {lengths[0]}; "
                "give token counts such as 256 or multiples of the window such as 4x"
            )
        longest = lengths[-1]
        if isinstance(self.bucket_size, int):
            _check_bucket(self.bucket_size, longest)
        if self.stride is not None and not 1 <= self.stride < lengths[0]:
            raise InputError(f"--stride {self.stride} must be at least 1 and below the shortest length {lengths[0]}")
        for k in self.context_limits:
            if not 2 <= int(k) < longest:
                raise InputError(
                    f"context limit {k} must be between 2 and the longest length {longest} (exclusive): the curve "
                    "compares limited context with the full context"
                )


def _check_bucket(b: int, longest: int) -> None:
    if b < 1 or b > longest:
        raise InputError(f"bucket size {b} must be between 1 and the longest length {longest}")
    if longest % b:
        divisors = [d for d in (64, 128, 256, 512, 1024, 2048, 4096) if longest % d == 0 and d < longest]
        raise InputError(
            f"bucket size {b} does not divide the longest length {longest}: the last bucket would be "
            f"partial; use a divisor of {longest}" + (f" such as {', '.join(map(str, divisors))}" if divisors else "")
        )
    if longest // b > MAX_BUCKETS:
        raise InputError(
            f"bucket size {b} gives {longest // b} buckets over {longest} tokens (at most {MAX_BUCKETS}); "
            f"use a bucket size of at least {math.ceil(longest / MAX_BUCKETS)}"
        )
