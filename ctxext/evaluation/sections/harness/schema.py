"""The ``harness`` section's results in ``report.json``: lm-eval's metrics per task, per-document outcomes."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ctxext.artifacts.report import Section


class HarnessTask(Section):
    """One task (or group) of a standard harness: its metrics, their standard errors, per-document outcomes."""

    metrics: dict[str, Any] = Field(default_factory=dict)
    stderr: dict[str, float | None] = Field(default_factory=dict)
    documents: int | None = None
    metric: str | None = None
    outcomes: list[float] = Field(default_factory=list)
    examples: list[dict[str, Any]] = Field(default_factory=list)


class Harness(Section):
    """The ``harness`` section: a standard harness (lm-evaluation-harness) run on the loaded, verified model."""

    harness: str
    version: str | None = None
    model_args: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    tasks: dict[str, HarnessTask]
    notes: list[str] = Field(default_factory=list)
    seconds: float | None = None
