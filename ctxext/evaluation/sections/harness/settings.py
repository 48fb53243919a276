"""The ``harness:`` section's settings, declared once (the flags of ``ctxext eval harness``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ctxext.evaluation.sections.ruler.settings import TemplateChoice, template_choice
from ctxext.evaluation.settings import CHAT_HELP, check_chat_choice

# Typed default (a bare lambda's list literal would be inferred as list[int]).
_EXPORT_DEPTHS: list[float] = [10, 50, 90]


class HarnessSettings(BaseModel):
    """An lm-evaluation-harness run (``ctxext eval harness`` flags and the ``harness:`` suite section).

    With ``lengths``, the ctxext tasks that ``tasks`` names (``needle``, ``multikey`` …) are first exported as
    lm-eval task files (``ctxext tasks export``, prompts built with the first model's tokenizer) and run by
    their tags, so every model answers the same prompts.

    Attributes:
        tasks: lm-eval task, group or tag names (``ctxext_needle``, ``ctxext_needle_256``, ``hellaswag`` …).
        include_path: a folder of extra task files (``ctxext tasks export`` writes one).
        lengths: export ctxext's tasks named in ``tasks`` at these lengths (tokens) first, and run them.
        depths, trials, seed, templates: with ``lengths``, the export's sampling (the RULER-style section's).
        chat_template: with ``lengths``, the chat template of the exported prompts (``auto``: decided from the first
            model, whose tokenizer builds them).
        batch_size: documents per generate call (1 feeds every prompt unpadded).
        max_length: lm-eval's ``max_length``, prompt + generated tokens (default: the model's context plus the
            answer budget: the export's largest, else lm-eval's default 256).
        limit: at most this many documents per task.
        num_fewshot: few-shot examples (default: each task's own).
        allow_beyond_context: run exported tasks longer than the model's context.
    """

    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(
        min_length=1,
        description="lm-eval tasks / groups / tags; with lengths, ctxext task names are exported first",
    )
    include_path: str | None = Field(default=None, description="extra lm-eval task folder (`ctxext tasks export`)")
    lengths: list[int] | None = Field(
        default=None, description="export ctxext's tasks named in tasks at these lengths (tokens) and run them"
    )
    depths: list[float] = Field(default_factory=_EXPORT_DEPTHS.copy, description="with lengths: depths in percent")
    trials: int = Field(default=10, gt=0, description="with lengths: samples per (task, length, depth)")
    seed: int = Field(default=0, description="with lengths: sample seed")
    templates: TemplateChoice = Field(
        default="heldout", description="with lengths: heldout, training, all, or template indices"
    )
    chat_template: str = Field(default="auto", description=f"with lengths: {CHAT_HELP}")
    batch_size: int = Field(default=1, ge=1, description="documents per generate call (1: no padding)")
    max_length: int | None = Field(
        default=None, ge=2, description="lm-eval max_length; none: the model's context + the answer budget"
    )
    limit: int | None = Field(default=None, ge=1, description="at most this many documents per task")
    num_fewshot: int | None = Field(default=None, ge=0, description="few-shot examples; none: each task's own")
    allow_beyond_context: bool = Field(default=False, description="run exported tasks longer than a model's context")

    @field_validator("chat_template")
    @classmethod
    def _chat_template(cls, value: str, info: ValidationInfo) -> str:
        return check_chat_choice(value, info)

    @field_validator("templates", mode="before")
    @classmethod
    def _templates(cls, value: object) -> object:
        return template_choice(value)

    @model_validator(mode="after")
    def _one_source_of_exported_tasks(self) -> HarnessSettings:
        if self.lengths is not None and self.include_path is not None:
            raise ValueError("give include_path (an export) or lengths (export now), not both")
        if self.lengths is not None and (not self.lengths or min(self.lengths) < 1):
            raise ValueError("lengths: give positive lengths in tokens, e.g. 256,1024")
        return self
