"""The ``ruler:`` section's settings, declared once (the flags of ``ctxext eval ruler``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ctxext.evaluation.lengths import Length
from ctxext.evaluation.settings import CHAT_HELP, DEFAULT_LENGTHS, Scoring, check_chat_choice

# Typed default (a bare lambda's list literal would be inferred as list[int]).
_RULER_DEPTHS: list[float] = [10, 50, 90]

TemplateChoice = Literal["heldout", "training", "all"] | list[int]


def template_choice(value: object) -> object:
    """A ``templates`` value as a flag gives it: ``0,2`` (comma-separated indices) is the list ``[0, 2]``."""
    if isinstance(value, str) and value.replace(",", "").replace(" ", "").isdigit():
        return [int(x) for x in value.replace(" ", "").split(",") if x]
    return value


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
    :class:`ctxext.evaluation.sections.ruler.engine.RulerSettings` (this model at lengths resolved in tokens).
    """

    model_config = ConfigDict(extra="forbid")

    @field_validator("chat_template")
    @classmethod
    def _chat_template(cls, value: str, info: ValidationInfo) -> str:
        return check_chat_choice(value, info)

    @field_validator("templates", mode="before")
    @classmethod
    def _templates(cls, value: object) -> object:
        return template_choice(value)

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
    threshold: float = Field(
        default=0.856, gt=0, le=1, description="the effective-length threshold (a fraction; RULER's 85.6 %)"
    )
    threshold_reference: Literal["original", "absolute"] = Field(
        default="absolute",
        description="absolute (RULER's: the score itself) or original (threshold × the model's score at its "
        "original length, NoLiMa's kind)",
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
