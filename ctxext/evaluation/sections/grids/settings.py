"""The ``passkey:`` and ``needle:`` sections' settings, declared once (``ctxext eval passkey`` / ``needle`` flags)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ctxext.evaluation.lengths import Length
from ctxext.evaluation.settings import CHAT_HELP, DEFAULT_LENGTHS, Scoring, check_chat_choice, checked_lengths
from ctxext.tasks.samples import check_depths

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
        return checked_lengths(values)

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
        default=None, description="the text after the haystack that asks for the needle (none: the built-in)"
    )
    answer_prefix: str | None = Field(
        default=None,
        description="the text that starts the answer after the question (with a chat template: the assistant's first "
        "words); none: the built-in question's, nothing after a custom question",
    )
    answer: str | None = Field(
        default=None, description="expected continuation of the answer prefix, scored token by token (none: built-in)"
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
