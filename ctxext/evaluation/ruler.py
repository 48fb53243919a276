"""RULER-style task suite: registered synthetic tasks × lengths × depths, with effective length.

Each task of the suite runs as a retrieval grid (:func:`ctxext.evaluation.grid.evaluate_task_grid`)
on one haystack, with trials spread over the chosen templates (``heldout``: the templates training does
not use by default). A task's score at a length is its accuracy over every depth and trial there.

**Effective length** (Hsieh et al. 2024, "RULER"): the longest evaluated length up to which the score
stays at or above a threshold — here every evaluated length from the shortest up to it must pass, so a
lucky long length after a failing one does not count. The threshold is, by default, 85 % of the model's
own score at its original (pretraining) length (``threshold_reference: original``), or an absolute
accuracy (``threshold_reference: absolute``). A relative threshold needs a task the model can do at its
original length: a task scoring below ``min_reference`` there has no effective length (n/a; 85 % of 2 %
would pass anything) and is left out of the overall one, which uses the mean score over the other tasks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxext.errors import InputError
from ctxext.evaluation.grid import GridSettings, evaluate_task_grid, load_haystack
from ctxext.evaluation.loading import LoadedModel
from ctxext.tasks import get_task

THRESHOLD_REFERENCES = ("original", "absolute")


@dataclass
class RulerTaskSpec:
    """One task of a RULER-style suite.

    Attributes:
        task: a registered task name.
        name: its label in the report (default: the task name); unique within the suite.
        options: task options (e.g. ``{"distractors": 3}``).
        templates: ``heldout`` (default), ``training``, ``all``, or template indices.
    """

    task: str
    name: str | None = None
    options: dict[str, int] = field(default_factory=dict)
    templates: str | list[int] | None = None

    @property
    def label(self) -> str:
        """The report label."""
        return self.name or self.task


@dataclass
class RulerSettings:
    """A RULER-style evaluation.

    Attributes:
        tasks: the tasks.
        lengths: sample lengths in tokens (the model's original length is added for the threshold).
        depths: depths in percent.
        trials: samples per (task, length, depth) cell.
        seed: sample seed (the same samples for every model: paired trials).
        haystack: data source for the haystack (``noise`` for the noise filler).
        text_field: column of table-like sources.
        split: split of a Hub data set.
        templates: the default template choice for tasks that do not set one.
        threshold: the effective-length threshold (a fraction).
        threshold_reference: ``original`` (threshold × the model's score at its original length) or
            ``absolute``.
        min_reference: with ``original``: the least score at the original length for a task to get an
            effective length (and count in the overall one).
        scoring: ``teacher-forced`` or ``generate``.
        allow_beyond_context: evaluate lengths above the model's context (marked).
    """

    tasks: list[RulerTaskSpec]
    lengths: list[int]
    depths: list[float] = field(default_factory=lambda: [10, 50, 90])
    trials: int = 10
    seed: int = 0
    haystack: str = "builtin:stdlib"
    text_field: str = "text"
    split: str = "test"
    templates: str | list[int] = "heldout"
    threshold: float = 0.85
    threshold_reference: str = "original"
    min_reference: float = 0.25
    scoring: str = "teacher-forced"
    allow_beyond_context: bool = False

    def validate(self) -> None:
        """Raise :class:`InputError` for a malformed suite section (unknown tasks, duplicate labels …)."""
        if not self.tasks:
            raise InputError("ruler: give at least one task (ruler.tasks)")
        labels = [t.label for t in self.tasks]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise InputError(f"ruler: task labels {dupes} appear twice; give each a distinct name")
        for spec in self.tasks:
            task = get_task(spec.task)
            task.resolve_options(spec.options)
            template_indices(spec.task, spec.templates or self.templates)
        if not 0 <= self.min_reference <= 1:
            raise InputError(f"ruler.min_reference {self.min_reference} must be a fraction in [0, 1]")
        if not 0 < self.threshold <= 1:
            raise InputError(f"ruler.threshold {self.threshold} must be a fraction in (0, 1]")
        if self.threshold_reference not in THRESHOLD_REFERENCES:
            raise InputError(f"ruler.threshold_reference {self.threshold_reference!r}: use original or absolute")


def template_indices(task: str, choice: str | list[int]) -> list[int]:
    """Template indices of a task for ``heldout`` / ``training`` / ``all`` / explicit indices.

    Raises:
        InputError: an unknown choice or an index the task does not have.
    """
    t = get_task(task)
    if isinstance(choice, list):
        for i in choice:
            t.template(i)
        if not choice:
            raise InputError(f"ruler: task {task}: give at least one template index")
        return list(choice)
    picks = {
        "heldout": list(t.heldout),
        "training": t.training_templates(),
        "all": list(range(len(t.templates))),
    }
    if choice not in picks:
        raise InputError(f"ruler: templates {choice!r}: use heldout, training, all, or a list of indices")
    if not picks[choice]:
        raise InputError(f"ruler: task {task} has no {choice} templates; choose indices explicitly")
    return picks[choice]


def effective_length(
    scores: dict[int, float],
    original: int,
    threshold: float,
    reference: str = "original",
    min_reference: float = 0.0,
) -> dict[str, Any]:
    """The longest length up to which every evaluated length scores at least the threshold.

    Args:
        scores: score (0–1) by length.
        original: the model's original context (its score there is the relative reference).
        threshold: a fraction.
        reference: ``original`` (relative to the score at ``original``) or ``absolute``.
        min_reference: with ``original``, the least reference score that gives a threshold.

    Returns:
        ``{"length", "threshold", "reference_score", "note"}``; ``length`` is None when even the
        shortest length fails or the reference score is zero or below ``min_reference``.
    """
    lengths = sorted(scores)
    ref_score = scores.get(original) if reference == "original" else None
    if reference == "original":
        if ref_score is None:
            raise InputError(f"effective length: no score at the original length {original}")
        if ref_score <= 0 or ref_score < min_reference:
            note = f"{ref_score * 100:.0f} % at the original length {original}: no relative threshold"
            return {"length": None, "threshold": None, "reference_score": ref_score, "note": note}
        bar = threshold * ref_score
    else:
        bar = threshold
    best = None
    for L in lengths:
        if scores[L] + 1e-12 < bar:
            break
        best = L
    note = "" if best is not None else "below the threshold at the shortest length"
    return {"length": best, "threshold": bar, "reference_score": ref_score, "note": note}


def evaluate_ruler(loaded: LoadedModel, settings: RulerSettings, show_progress: bool = True) -> dict[str, Any]:
    """Every task of a RULER-style suite on one model, with effective lengths.

    Args:
        loaded: the model.
        settings: tasks, lengths, depths, trials, haystack, templates, threshold.
        show_progress: progress bars.

    Returns:
        The ``ruler`` section of a report: per-task grids, score by task × length, effective lengths.
    """
    settings.validate()
    started = time.perf_counter()
    original = loaded.original_length
    lengths = sorted(set(settings.lengths) | ({original} if settings.threshold_reference == "original" else set()))
    hay = load_haystack(loaded, settings.haystack, settings.text_field, settings.split, 2 * max(lengths))
    grid = GridSettings(
        lengths=lengths,
        depths=list(settings.depths),
        trials=settings.trials,
        seed=settings.seed,
        scoring=settings.scoring,
        allow_beyond_context=settings.allow_beyond_context,
    )
    tasks: dict[str, Any] = {}
    table: dict[str, dict[str, float]] = {}
    for spec in settings.tasks:
        templates = template_indices(spec.task, spec.templates or settings.templates)
        res = evaluate_task_grid(loaded, grid, spec.task, hay, templates, spec.options, show_progress, spec.label)
        scores = {int(L): e["accuracy"] for L, e in res["by_length"].items()}
        res["effective_length"] = effective_length(
            scores, original, settings.threshold, settings.threshold_reference, settings.min_reference
        )
        tasks[spec.label] = res
        table[spec.label] = {str(L): s for L, s in scores.items()}
    # The overall effective length averages the tasks that have a reference (all of them when absolute).
    counted = [
        t
        for t in table
        if settings.threshold_reference == "absolute" or tasks[t]["effective_length"]["threshold"] is not None
    ]
    mean = {L: sum(table[t][str(L)] for t in counted) / len(counted) if counted else 0.0 for L in lengths}
    none = "no task scores at the original length"
    overall: dict[str, Any] = (
        effective_length(mean, original, settings.threshold, settings.threshold_reference)
        if counted
        else {"length": None, "threshold": None, "reference_score": None, "note": none}
    )
    overall["tasks"] = counted
    return {
        "settings": {
            **{k: v for k, v in settings.__dict__.items() if k != "tasks"},
            "tasks": [s.__dict__ for s in settings.tasks],
            "lengths": lengths,
        },
        "original_length": original,
        "haystack": hay.name,
        "scoring": settings.scoring,
        "tasks": tasks,
        "scores": table,
        "mean_by_length": {str(L): v for L, v in mean.items()},
        "effective_length": overall,
        "seconds": round(time.perf_counter() - started, 3),
    }


def trained_tasks(run_ref: str | None) -> list[str] | None:
    """Task names a run was trained on, from its recipe's ``data.mixture`` (None: unknown / not a run).

    Tolerant of the mixture's exact form: entries naming a ``task`` key, or a source written
    ``task:NAME``, count. Anything unreadable gives None rather than an error.
    """
    if not run_ref:
        return None
    recipe = Path(run_ref) / "recipe.yaml"
    if not recipe.is_file():
        return None
    try:
        import yaml

        data = (yaml.safe_load(recipe.read_text()) or {}).get("data") or {}
    except Exception:  # noqa: BLE001 — a recipe we cannot read only loses the marks, never the evaluation
        return None
    mixture = data.get("mixture") if isinstance(data, dict) else None
    if not isinstance(mixture, list):
        return []
    names: list[str] = []
    for item in mixture:
        if not isinstance(item, dict):
            continue
        name = item.get("task")
        source = item.get("source") or item.get("path") or ""
        if not name and isinstance(source, str) and source.startswith("task:"):
            name = source.split(":", 1)[1]
        if isinstance(name, str) and name and name not in names:
            names.append(name)
    return names
