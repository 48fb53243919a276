"""A suite section in one module (a plugin's; built-in sections are folders): copying a repeated random sequence.

Each trial is ``L/2`` random tokens repeated once; the score is the share of the second copy's tokens
that the model predicts (argmax, teacher-forced), a plain induction / long-range copy measure.
Registered when imported; tests/integration/test_extension_points.py runs it in a suite and as ``ctxext eval
toy-repeat``. Its plot and model-card rows are the defaults (its ``by_length`` numbers, its report table); it adds
paired statistics: every model sees the same seeded sequences, so trials pair across models.
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

        from ctxext.rope.runtime import reset_dynamic_rope

        generator = torch.Generator().manual_seed(settings.seed)
        vocab = int(loaded.model.config.vocab_size)
        by_length: dict[str, float] = {}
        per_trial: dict[str, list[float]] = {}
        for length in lengths:
            if length > loaded.context_length and not beyond_context_ok:
                raise InputError(f"toy_repeat: length {length} is beyond {loaded.name}'s context")
            half = length // 2
            scores = []
            for _ in range(settings.trials):
                copy = torch.randint(0, vocab, (1, half), generator=generator)
                ids = torch.cat([copy, copy], dim=1).to(loaded.device)
                reset_dynamic_rope(loaded.model)
                with torch.no_grad():
                    logits = loaded.model(ids).logits
                scores.append(float((logits[0, half - 1 : -1].argmax(-1) == ids[0, half:]).float().mean()))
            by_length[str(length)] = sum(scores) / len(scores)
            per_trial[str(length)] = scores
        return {"by_length": by_length, "trials": settings.trials, "per_trial": per_trial}

    def paired(
        self, model: dict[str, Any], reference: dict[str, Any], resamples: int, seed: int, notes: list[str]
    ) -> list[dict[str, Any]]:
        """Copy accuracy, model − reference, per length: paired bootstrap over the (same) trials."""
        import numpy as np

        from ctxext.scoring.stats import paired_mean_difference

        a, b = model[self.name]["per_trial"], reference[self.name]["per_trial"]
        rows = []
        for length in sorted(set(a) & set(b), key=int):
            if len(a[length]) != len(b[length]):
                notes.append(f"{model['name']}: {self.name} at {length} not paired (different trial counts)")
                continue
            stat = paired_mean_difference(np.array(a[length]), np.array(b[length]), resamples, seed)
            rows.append({"model": model["name"], "length": int(length), **stat})
        return rows

    def summary(self, entry: dict[str, Any]) -> str | None:
        """Copy accuracy per length."""
        return ", ".join(f"{L}: {v * 100:.0f} %" for L, v in entry[self.name]["by_length"].items())
