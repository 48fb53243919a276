"""A suite section in one file, as docs/extending.md shows: copying a repeated random token sequence.

Each trial is ``L/2`` random tokens repeated once; the score is the share of the second copy's tokens
that the model predicts (argmax, teacher-forced), a plain induction / long-range copy measure.
Registered when imported; tests/test_extension_points.py runs it in a suite.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ctxext.errors import InputError
from ctxext.evaluation.sections import SuiteSection, register_section


class RepeatSettings(BaseModel):
    """The ``toy_repeat:`` section of a suite."""

    model_config = ConfigDict(extra="forbid")

    lengths: list[int | str] = Field(default_factory=lambda: ["1x", "2x"])
    trials: int = Field(default=2, gt=0)
    seed: int = 0


@register_section
class RepeatCopy(SuiteSection):
    """Copy accuracy of a repeated random sequence, by length."""

    name = "toy_repeat"
    title = "Repeated-sequence copying (toy section)"
    settings = RepeatSettings

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """``{"by_length": {L: accuracy}, "trials": n}``."""
        import torch

        from ctxext.rope.core import reset_dynamic_rope

        generator = torch.Generator().manual_seed(settings.seed)
        vocab = int(loaded.model.config.vocab_size)
        by_length = {}
        for length in lengths:
            if length > loaded.context_length and not beyond_context_ok:
                raise InputError(f"toy_repeat: length {length} is beyond {loaded.name}'s context")
            half = length // 2
            correct = 0
            for _ in range(settings.trials):
                copy = torch.randint(0, vocab, (1, half), generator=generator)
                ids = torch.cat([copy, copy], dim=1).to(loaded.device)
                reset_dynamic_rope(loaded.model)
                with torch.no_grad():
                    logits = loaded.model(ids).logits
                correct += int((logits[0, half - 1 : -1].argmax(-1) == ids[0, half:]).sum())
            by_length[str(length)] = correct / (half * settings.trials)
        return {"by_length": by_length, "trials": settings.trials}
