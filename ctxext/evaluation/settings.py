"""The settings of the evaluation workflows, declared once (torch-free: the command line builds its flags here).

:class:`PerplexitySettings` is *the* declaration of a perplexity evaluation: the ``perplexity:`` section of
a suite, the flags of ``ctxext eval ppl`` (generated from its fields, :mod:`ctxext.recipe.flags`) and the
argument of :func:`ctxext.evaluation.perplexity.evaluate_perplexity`. Its field defaults are the only
defaults, so ``ctxext eval ppl`` and ``ctxext eval run`` read the same documents unless told otherwise.

Lengths are token counts or expressions relative to a model's context (:func:`resolve_length`): ``"2x"``
(twice the original context), ``"target"`` (the configured context), ``"2x target"``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ctxext.errors import InputError
from ctxext.scoring.stats import DEFAULT_RESAMPLES
from ctxext.tasks.samples import check_depths

Scoring = Literal["teacher-forced", "generate", "both"]
CHAT_HELP = "auto (the tokenizer's chat template, if it has one), none, or a Jinja chat template file"


def check_chat_choice(value: str, info: ValidationInfo | None = None) -> str:
    """A ``chat_template`` setting's value, checked where it is declared (so flags and suite keys fail alike).

    A suite passes its folders as validation context (``{"folders": [...]}``): a template file may be relative to
    the working folder or to them, as every path in a suite may.
    """
    from ctxext.tasks.chat import CHAT_CHOICES

    folders = [Path(f) for f in ((info.context or {}).get("folders", []) if info is not None else [])]
    if value not in CHAT_CHOICES and not any((f / value).is_file() for f in [Path("."), *folders]):
        raise ValueError(
            f"{value!r}: use auto (the tokenizer's chat template, if it has one), none (plain prompts) or the path "
            "of a Jinja chat template file"
        )
    return value


Length = int | str

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
# The default lengths of every evaluation (typed: a bare lambda's list literal would be inferred as list[str]).
DEFAULT_LENGTHS: list[Length] = ["1x", "2x", "4x"]
# A bootstrap interval over one or two documents has (almost) zero width and means nothing.
MIN_DOCS = 3
MAX_BUCKETS = 1024


def resolve_length(value: Length, original: int, context: int) -> int:
    """A length: an int, ``"Nx"`` (N × original context), ``"target"`` (configured context) or ``"Nx target"``."""
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    if text == "target":
        return context
    beyond = re.fullmatch(r"(\d+(?:\.\d+)?)\s*x\s*target", text)
    if beyond:
        return int(round(float(beyond.group(1)) * context))
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*x", text)
    if m:
        return int(round(float(m.group(1)) * original))
    if text.isdigit():
        return int(text)
    raise InputError(
        f"length {value!r}: use a token count, 'Nx' (N × the original context), 'target' or 'Nx target' "
        "(N × the target, to evaluate beyond it)"
    )


def is_beyond_target(value: Length) -> bool:
    """Whether a length asks for a multiple of the target (``"2x target"``): kept past the context."""
    return isinstance(value, str) and re.fullmatch(r"\s*\d+(?:\.\d+)?\s*x\s*target\s*", value.lower()) is not None


def auto_bucket(longest: int) -> int:
    """The ``bucket_size: auto`` of a longest length: an eighth of it (or the largest of ½, ¼ that divides it)."""
    for parts in (8, 4, 2, 1):
        if longest % parts == 0:
            return longest // parts
    return longest


def _check_lengths(values: list[Length]) -> list[Length]:
    """A field validator's check: every length is a token count or a relative length."""
    for value in values:
        try:
            resolve_length(value, 1, 1)
        except InputError as exc:
            raise ValueError(str(exc)) from None
    return values


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
        return _check_lengths(values)

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


# Typed default (a bare lambda's list literal would be inferred as list[int]).
_GRID_DEPTHS: list[float] = [0, 25, 50, 75, 100]


class PasskeySettings(BaseModel):
    """A passkey retrieval grid: lengths × depths, ``trials`` seeded keys per cell."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    lengths: list[Length] = Field(
        default_factory=DEFAULT_LENGTHS.copy,
        min_length=1,
        description="prompt lengths: tokens, Nx (× the original context), target, Nx target",
    )
    depths: list[float] = Field(
        default_factory=_GRID_DEPTHS.copy, min_length=1, description="needle depths in percent (0 = the start)"
    )
    trials: int = Field(default=5, gt=0, description="samples per cell (keys, haystack offsets)")
    seed: int = Field(default=0, description="seed of the samples")
    max_new_tokens: int = Field(default=12, gt=0, description="generation: tokens generated at least")
    answer_margin: int = Field(default=8, ge=0, description="generation: tokens generated beyond the answer's length")
    scoring: Scoring = Field(
        default="teacher-forced",
        description="teacher-forced (one forward pass over prompt + answer, exact for greedy decoding), generate "
        "(greedy decoding scored by RULER's string match) or both, on the same trials",
    )
    chat_template: str = Field(default="auto", description=CHAT_HELP)
    allow_beyond_context: bool = Field(
        default=False,
        description="keep relative lengths (2x) above the reference model's context instead of dropping them; lengths "
        "above a model's context are marked †",
    )

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, values: list[Length]) -> list[Length]:
        return _check_lengths(values)

    @field_validator("chat_template")
    @classmethod
    def _chat_template(cls, value: str, info: ValidationInfo) -> str:
        return check_chat_choice(value, info)

    @field_validator("depths")
    @classmethod
    def _depths(cls, values: list[float]) -> list[float]:
        return check_depths(values)


class NeedleSettings(PasskeySettings):
    """A needle-in-a-haystack grid: the passkey grid's settings, a haystack and the needle to hide."""

    haystack: str = Field(
        default="builtin:stdlib", description="haystack text: file, folder, jsonl, Hub data set, builtin:NAME, noise"
    )
    text_field: str = Field(default="text", description="text column of a table-like haystack")
    split: str = Field(default="test", description="split of a Hub data set")
    needle: str | None = Field(default=None, description="the sentence to hide (none: the San Francisco needle)")
    question: str | None = Field(
        default=None, description="the text that ends the prompt, asking for the needle (none: the built-in)"
    )
    answer: str | None = Field(
        default=None, description="expected continuation of the question, scored token by token (none: the built-in)"
    )

    @model_validator(mode="after")
    def _custom_needle_is_whole(self) -> NeedleSettings:
        # The built-in question asks for the built-in needle's answer: a custom needle scored against it is 0 %
        # by construction, and half a custom needle is always a mistake.
        given = [k for k in ("needle", "question", "answer") if getattr(self, k)]
        if given and len(given) < 3:
            missing = [k for k in ("needle", "question", "answer") if k not in given]
            raise ValueError(
                f"{', '.join(given)} given without {' and '.join(missing)}: a custom needle needs all three (the "
                "built-in question and answer belong to the built-in needle)"
            )
        return self


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
        return value if value is None else _check_lengths([value])[0]

    @field_validator("chat_template")
    @classmethod
    def _chat_template(cls, value: str, info: ValidationInfo) -> str:
        return check_chat_choice(value, info)

    def prompt_length(self, original: int, context: int) -> int:
        """The prompt budget in tokens for a model with these contexts (its configured context by default)."""
        return context if self.max_length is None else resolve_length(self.max_length, original, context)


# Typed default (a bare lambda's list literal would be inferred as list[int]).
_RULER_DEPTHS: list[float] = [10, 50, 90]

TemplateChoice = Literal["heldout", "training", "all"] | list[int]


class RulerTaskEntry(BaseModel):
    """One task of the RULER-style section."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(description="a registered task: needle, multikey, multivalue, multiquery, variable_tracking, …")
    name: str | None = Field(default=None, description="label in the report (default: the task name)")
    options: dict[str, int] = Field(default_factory=dict, description="task options, e.g. {distractors: 3}")
    templates: TemplateChoice | None = None

    @property
    def label(self) -> str:
        """The report label (the name, else the task)."""
        return self.name or self.task


class RulerSuiteSettings(BaseModel):
    """RULER-style synthetic tasks × lengths × depths, with effective length.

    The ``ruler:`` section of a suite and the flags of ``ctxext eval ruler``; the engine runs it as
    :class:`ctxext.evaluation.ruler.RulerSettings` (this model at lengths resolved in tokens).
    """

    model_config = ConfigDict(extra="forbid")

    @field_validator("chat_template")
    @classmethod
    def _chat_template(cls, value: str, info: ValidationInfo) -> str:
        return check_chat_choice(value, info)

    tasks: list[RulerTaskEntry] = Field(
        description='registered tasks, each {task, name, options, templates}; as a flag, JSON: [{"task": "needle"}]'
    )
    lengths: list[Length] = Field(
        default_factory=DEFAULT_LENGTHS.copy,
        description="sample lengths: tokens, Nx (× the original context), target, Nx target",
    )
    depths: list[float] = Field(default_factory=_RULER_DEPTHS.copy, description="needle depths in percent")
    trials: int = Field(default=10, gt=0, description="samples per (task, length, depth)")
    seed: int = Field(default=0, description="sample seed (the same samples for every model: paired trials)")
    haystack: str = Field(default="builtin:stdlib", description="haystack text source, or noise")
    text_field: str = Field(default="text", description="text column of a table-like haystack")
    split: str = Field(default="test", description="split of a Hub data set")
    templates: TemplateChoice = Field(
        default="heldout", description="templates of the tasks that set none: heldout, training, all, or indices"
    )
    threshold: float = Field(default=0.85, gt=0, le=1, description="the effective-length threshold (a fraction)")
    threshold_reference: Literal["original", "absolute"] = Field(
        default="original",
        description="original (threshold × the model's score at its original length) or absolute",
    )
    min_reference: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="with original: the least score at the original length for a task to get an effective length",
    )
    scoring: Scoring = Field(
        default="teacher-forced",
        description="teacher-forced, generate (greedy decoding scored by RULER's string match) or both",
    )
    max_new_tokens: int = Field(default=12, gt=0, description="generation: tokens generated at least")
    answer_margin: int = Field(default=8, ge=0, description="generation: tokens generated beyond the answer's length")
    chat_template: str = Field(default="auto", description=CHAT_HELP)
    control: bool = Field(
        default=False, description="also score every task with its needles replaced by haystack text (chance rate)"
    )


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

    @field_validator("length")
    @classmethod
    def _length(cls, value: Length) -> Length:
        return _check_lengths([value])[0]
