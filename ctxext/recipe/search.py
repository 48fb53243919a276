"""The settings of a RoPE factor search, declared once: the recipe's ``search:`` keys and ``ctxext search``'s flags.

:class:`SearchOptions` is *the* declaration: its field defaults are the only defaults, the recipe section
(:class:`ctxext.recipe.schema.SearchSection`) adds only ``out``, the runtime settings
(:class:`ctxext.search.settings.SearchSettings`) add only what names the run (model, target, folder, device), and
the flags of ``ctxext search`` are generated from its fields (:mod:`ctxext.recipe.flags`).

The defaults are the recommended settings, the ones behind the published 4× result
(``benchmarks/results/search.md``): the worst-depth needle objective on 128 samples, the attention factor
searched within the in-window range the paired interval cannot tell from the base, population 32,
12 generations. Shares are in **percent** (``window_tolerance``, ``min_form_accuracy``), as written by
users; the algorithm's fractions come from :attr:`SearchOptions.window_tolerance_fraction` and
:attr:`SearchOptions.min_form_accuracy_fraction`, the one place that converts them.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ctxext.errors import InputError
from ctxext.recipe.budget import parse_budget


class SearchOptions(BaseModel):
    """A RoPE factor search (``ctxext search``; in a recipe, run before training with ``rope.method: longrope``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    objective: Literal["needle", "needle-worst", "far-ppl"] = Field(
        default="needle-worst",
        description="needle-worst (answer NLL of the worst needle depth), needle (mean over depths, LongRoPE2) "
        "or far-ppl (NLL beyond the window)",
    )
    budget: str = Field(default="10m", description="time budget of the search: 90s, 10m, 1h")
    population: int = Field(default=32, ge=4, description="candidates per generation (LongRoPE: 64)")
    generations: int = Field(default=12, ge=0, description="generations after the initial population (LongRoPE: 40)")
    seed: int = Field(default=0, description="seed of the search and of its needle set")
    samples: int = Field(
        default=128, ge=1, description="needle samples (or far-ppl documents) of the target length per candidate"
    )
    data: str = Field(default="builtin:stdlib-train", description="data of the fitness set (a training split)")
    attention_factor: str | float = Field(
        default="search",
        description="search (searched with the factors, within window_tolerance), 1 (model unchanged inside its "
        "window), auto (√(1 + ln s / ln L), LongRoPE) or a number",
    )
    window_tolerance: float = Field(
        default=0.0,
        ge=0,
        lt=100,
        description="attention factor search: in-window perplexity increase allowed, percent (upper end of the "
        "paired 95% CI vs the base); 0: only changes the CI cannot detect",
    )
    min_form_accuracy: float = Field(
        default=50.0,
        ge=0,
        le=100,
        description="needle objectives: use a needle form only if the base retrieves at least this share of it "
        "inside its own window, percent",
    )
    mutation_rate: float = Field(default=0.3, gt=0, le=1, description="probability that a mutation redraws a dimension")
    step: float = Field(default=0.01, gt=0, description="grid of mutated factor (and attention factor) values")
    window_docs: int = Field(default=256, ge=1, description="windows of the original length for in-window statistics")
    report: bool = Field(default=True, description="compare with PI/NTK/YaRN/llama3 on held-out files")
    report_trials: int = Field(default=20, ge=1, description="report: held-out needle trials per depth")
    report_docs: int = Field(default=24, ge=1, description="report: held-out documents for perplexity")

    @field_validator("budget", mode="before")
    @classmethod
    def _budget(cls, value: object) -> str:
        text = str(value)
        try:
            parse_budget(text)
        except InputError as exc:
            raise ValueError(str(exc)) from None
        return text

    @field_validator("attention_factor")
    @classmethod
    def _attention(cls, value: str | float) -> str | float:
        if isinstance(value, str) and value.strip().lower() in ("auto", "search"):
            return value.strip().lower()
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number <= 0:
            raise ValueError(f"{value!r}: use search, auto or a positive number (1 = no scaling)")
        return number

    @property
    def budget_seconds(self) -> float:
        """The budget in seconds."""
        return parse_budget(self.budget)

    @property
    def window_tolerance_fraction(self) -> float:
        """``window_tolerance`` as the fraction the algorithm uses (0.5 % → 0.005)."""
        return self.window_tolerance / 100

    @property
    def min_form_accuracy_fraction(self) -> float:
        """``min_form_accuracy`` as the fraction the algorithm uses (50 % → 0.5)."""
        return self.min_form_accuracy / 100

    def searches_attention(self) -> bool:
        """Whether the attention factor is searched (``attention_factor: search``)."""
        return self.attention_factor == "search"
