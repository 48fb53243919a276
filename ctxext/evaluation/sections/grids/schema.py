"""The retrieval grids' results in ``report.json`` (``passkey``, ``needle``; the ``ruler`` tasks are grids too)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from ctxext.artifacts.report import Fraction, Section


class TeacherForced(Section):
    """Teacher-forced outcomes: trials whose every answer token is the argmax (exact for greedy decoding)."""

    correct: int = Field(ge=0)
    trials: int = Field(ge=0)
    accuracy: Fraction = None

    @model_validator(mode="after")
    def _correct_within_trials(self) -> TeacherForced:
        if self.correct > self.trials:
            raise ValueError(f"correct: {self.correct} correct trials out of {self.trials}")
        return self


class Generated(Section):
    """RULER's string-match score of greedy generations (a fraction; RULER prints it × 100).

    ``metric``: ``string_match_all`` (per trial, the fraction of reference strings found) or
    ``string_match_part`` (1 if any is found); ``scores``: each trial's (cells only).
    """

    metric: str
    score: Fraction = None
    trials: int = Field(ge=0)
    scores: list[Fraction] = Field(default_factory=list)


class Accuracy(Section):
    """Correct trials out of a number of trials, with a 95 % Wilson interval.

    Where both scorings ran, ``teacher_forced`` and ``generated`` hold each (absent in
    older reports and where that scoring did not run).
    """

    correct: int = Field(ge=0)
    trials: int = Field(ge=0)
    accuracy: Fraction = None
    ci_low: Fraction = None
    ci_high: Fraction = None
    teacher_forced: TeacherForced | None = None
    generated: Generated | None = None

    @model_validator(mode="after")
    def _correct_within_trials(self) -> Accuracy:
        if self.correct > self.trials:
            raise ValueError(f"correct: {self.correct} correct trials out of {self.trials}")
        return self


class GridCell(Accuracy):
    """One (length, depth) cell of a retrieval grid, with each trial's outcome (for paired tests)."""

    length: int = Field(gt=0)
    depth: float = Field(ge=0, le=100)
    score: Fraction = None
    beyond_context: bool = False
    outcomes: list[int] = Field(default_factory=list)
    examples: list[dict[str, Any]] = Field(default_factory=list)


class Grid(Section):
    """A retrieval task (passkey, needle, a RULER-style task) scored over lengths × depths.

    ``scoring`` is ``teacher-forced`` or ``generate``; ``None`` in reports written before scoring modes existed
    (they generated).
    """

    task: str | None = None
    registry_task: str | None = None
    scoring: str | None = None
    chat_template: str | None = None
    chat_template_reason: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    cells: list[GridCell]
    by_length: dict[str, Accuracy] = Field(default_factory=dict)
    by_depth: dict[str, Accuracy] = Field(default_factory=dict)
    overall: Accuracy | None = None

    def lengths(self) -> list[int]:
        """The evaluated lengths, ascending."""
        return sorted({c.length for c in self.cells})

    def depths(self) -> list[float]:
        """The evaluated depths (percent), ascending."""
        return sorted({c.depth for c in self.cells})

    def accuracy_at(self, length: int) -> float | None:
        """Accuracy over all depths at one length (all trials pooled)."""
        agg = self.by_length.get(str(length))
        if agg is not None and agg.accuracy is not None:
            return agg.accuracy
        cells = [c for c in self.cells if c.length == length]
        trials = sum(c.trials for c in cells)
        return sum(c.correct for c in cells) / trials if trials else None
