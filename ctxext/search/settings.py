"""The settings of one search (the declared search options and this run's names) and what it found."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from ctxext.errors import InputError
from ctxext.recipe.search import SearchOptions


class SearchSettings(SearchOptions):
    """What to search and how: the declared :class:`~ctxext.recipe.search.SearchOptions` and this run's names.

    Every search default is declared in ``SearchOptions``; these fields name the run.

    Attributes:
        model: model folder, Hub id or ``builtin:NAME``.
        target_length: the context to extend to.
        out: output folder (the model folder, with the log and the report).
        original_length: overrides the pretraining length.
        device: ``cpu`` / ``cuda`` (default: CUDA when available).
        resume: continue the search logged in ``out``.
        overwrite: replace an existing ``out``.
        show_progress: draw a progress bar.
    """

    model: str
    target_length: int = Field(gt=0)
    out: Path
    original_length: int | None = Field(default=None, gt=0)
    device: str | None = None
    resume: bool = False
    overwrite: bool = False
    show_progress: bool = True

    def validate_run(self) -> None:
        """Raise :class:`InputError` for settings that cannot run together (each value is checked on assignment)."""
        from ctxext.search.objective import OBJECTIVES

        if self.objective not in OBJECTIVES:
            raise InputError(f"unknown objective {self.objective!r}; choose one of: {', '.join(OBJECTIVES)}")
        if self.resume and self.overwrite:
            raise InputError("--resume and --overwrite contradict each other: choose one")
        if self.report:
            from ctxext.search.report import check_fitness_data

            check_fitness_data(self.data)

    def logged(self, original_length: int, rotary_dim: int) -> dict[str, Any]:
        """The settings recorded in the log's header (everything that defines the search)."""
        from ctxext.search.apply import resolve_attention_factor

        attention: str | float = "search"
        if not self.searches_attention():
            attention = resolve_attention_factor(
                self.attention_factor, self.target_length / original_length, original_length
            )
        # Settings that only define some searches are recorded only for those.
        conditional: dict[str, Any] = {}
        if self.searches_attention():
            conditional |= {"window_tolerance": self.window_tolerance_fraction, "window_docs": self.window_docs}
        if self.objective != "far-ppl":
            conditional["min_form_accuracy"] = self.min_form_accuracy_fraction
        return {
            "model": self.model,
            "target_length": self.target_length,
            "original_length": original_length,
            "rotary_dim": rotary_dim,
            "objective": self.objective,
            "population": self.population,
            "generations": self.generations,
            "seed": self.seed,
            "samples": self.samples,
            "data": self.data,
            "mutation_rate": self.mutation_rate,
            "step": self.step,
            "attention_factor": attention,
            "budget_seconds": self.budget_seconds,
            **conditional,
        }


@dataclass
class SearchResult:
    """What a search found.

    Attributes:
        out: the written folder (None when nothing was written).
        long_factor: the best factors.
        score: their training-split objective.
        best_seed: the best seed (named method / grid point) and its score.
        evaluations: candidates evaluated (replayed ones included).
        ended: ``generations`` or ``budget``.
        seconds: search wall time over all sessions; ``cpu_seconds`` likewise in CPU time.
        attention_factor: the attention factor written (fixed, or the searched one).
        report: the held-out comparison (empty without a report).
    """

    out: Path | None
    long_factor: list[float]
    score: float
    best_seed: dict[str, Any]
    evaluations: int
    ended: str
    seconds: float
    cpu_seconds: float
    attention_factor: float = 1.0
    report: dict[str, Any] = field(default_factory=dict)


# The kind recorded in the output folder's manifest (ctxext.atomic): only a search folder ctxext wrote is
# resumed or replaced.
SEARCH_KIND = "search"
