"""The ``ruler`` section's results in ``report.json``: per-task grids, scores by task × length, effective lengths."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ctxext.artifacts.report import Section
from ctxext.evaluation.sections.grids.schema import Accuracy, Grid


class EffectiveLength(Section):
    """RULER's effective length: the longest length up to which every length scores at least ``threshold``.

    ``name``: the definition's label in the named ones (``RULER (≥ 85.6)``,
    ``NoLiMa (≥ 85 % of score at short context)``).
    """

    length: int | None = None
    threshold: float | None = None
    reference_score: float | None = None
    name: str | None = None
    note: str | None = None


# scoring (teacher_forced / generated) → definition (ruler / nolima) → effective length
NamedEffectiveLengths = dict[str, dict[str, EffectiveLength]]


class GridControl(Section):
    """The no-needle control of a task: its prompts with every insert replaced by haystack text (chance rate).

    Only ``note`` where the task inserts nothing.
    """

    note: str | None = None
    depth: float | None = None
    by_length: dict[str, Accuracy] = Field(default_factory=dict)
    overall: Accuracy | None = None


class RulerTask(Grid):
    """One task of a RULER-style suite, with its effective length (the section's setting, and both named ones).

    ``control``: the no-needle control, where the section ran it (``control: true``).
    """

    effective_length: EffectiveLength = Field(default_factory=EffectiveLength)
    effective_lengths: NamedEffectiveLengths = Field(default_factory=dict)
    control: GridControl | None = None


class Ruler(Section):
    """The ``ruler`` section: per-task grids, score by task × length, effective lengths."""

    settings: dict[str, Any] = Field(default_factory=dict)
    original_length: int | None = None
    haystack: str | None = None
    scoring: str | None = None
    tasks: dict[str, RulerTask]
    scores: dict[str, dict[str, float]] = Field(default_factory=dict)
    mean_by_length: dict[str, float] = Field(default_factory=dict)
    effective_length: EffectiveLength = Field(default_factory=EffectiveLength)
    trained_tasks: list[str] | None = None
    chat_template: str | None = None
    chat_template_reason: str | None = None
    scores_by: dict[str, dict[str, dict[str, float]]] = Field(default_factory=dict)
    mean_by_length_by: dict[str, dict[str, float]] = Field(default_factory=dict)
    effective_lengths: NamedEffectiveLengths = Field(default_factory=dict)
