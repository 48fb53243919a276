"""RULER-style task suite: registered synthetic tasks × lengths × depths, with effective length.

Each task of the suite runs as a retrieval grid (:func:`ctxext.evaluation.sections.grids.engine.evaluate_task_grid`)
on one haystack, with trials spread over the chosen templates (``heldout``: the templates training does
not use by default). A task's score at a length is its accuracy over every depth and trial there.

**Effective length** (Hsieh et al. 2024, "RULER"): the longest evaluated length up to which the score
stays at or above a threshold — here every evaluated length from the shortest up to it must pass, so a
lucky long length after a failing one does not count. The threshold is, by default, RULER's own: an absolute
85.6 % (``threshold: 0.856``, ``threshold_reference: absolute``; Llama-2-7B's score at 4k), or a fraction of
the model's own score at its original (pretraining) length (``threshold_reference: original``, NoLiMa's kind
of bar). A relative threshold needs a task the model can do at its original length: a task scoring below
``min_reference`` there has no effective length (n/a; 85 % of 2 % would pass anything) and is left out of the
overall one, which uses the mean score over the other tasks.

Both named definitions are reported beside it, for every scoring that ran (``effective_lengths``):

* ``ruler`` — "RULER (≥ 85.6)": the absolute threshold of Hsieh et al. (Llama-2-7B's score at 4k);
* ``nolima`` — "NoLiMa (≥ 85 % of score at short context)": 85 % of the model's own score at short context
  (Modarressi et al. 2025: their base score, measured at < 1k tokens; here at the model's original length,
  the shortest length of a context-extension run), with the same ``min_reference`` floor.

Scorings: ``teacher_forced`` (accuracy) and ``generated`` (RULER's string-match score of greedy
generations, :mod:`ctxext.scoring.string_match`), as the section's ``scoring`` ran them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ctxext.errors import InputError
from ctxext.evaluation.control import evaluate_control
from ctxext.evaluation.sections.grids.engine import GridSettings, evaluate_task_grid, load_haystack
from ctxext.evaluation.sections.ruler.settings import RulerSuiteSettings, RulerTaskEntry
from ctxext.models.load import LoadedModel
from ctxext.tasks import get_task
from ctxext.tasks.chat import ChatDecision

THRESHOLD_REFERENCES = ("original", "absolute")

# The two named effective-length definitions every RULER section reports: key → (label, threshold, reference).
NAMED_THRESHOLDS = {
    "ruler": ("RULER (≥ 85.6)", 0.856, "absolute"),
    "nolima": ("NoLiMa (≥ 85 % of score at short context)", 0.85, "original"),
}


# One task of a RULER-style evaluation: the section's declaration (its label: the name, else the task).
RulerTaskSpec = RulerTaskEntry


class RulerSettings(RulerSuiteSettings):
    """A RULER-style evaluation: a suite's ``ruler:`` section (every key, its one default) at resolved lengths.

    Attributes:
        lengths: sample lengths in tokens (the model's original length is added for the threshold).
        allow_beyond_context: evaluate lengths above the model's context (marked).
    """

    lengths: list[int]  # type: ignore[assignment]  # resolved: the section's relative lengths (2x) in tokens
    allow_beyond_context: bool = False

    @classmethod
    def of_section(cls, section: RulerSuiteSettings, lengths: list[int], allow_beyond: bool) -> RulerSettings:
        """The settings of a suite's validated ``ruler:`` section at lengths resolved in tokens."""
        # Not validated again: the suite validated the section (a chat template against the suite's folders).
        values = {**dict(section), "lengths": list(lengths), "allow_beyond_context": allow_beyond}
        return cls.model_construct(**values)

    def check(self) -> None:
        """Raise :class:`InputError` for what the declaration cannot check: unknown tasks, duplicate labels …"""
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
        self.grid([1], False).validate()

    def grid(self, lengths: list[int], allow_beyond: bool, chat: ChatDecision | None = None) -> GridSettings:
        """The retrieval-grid settings every task of the section runs with (``chat``: a run's ``auto`` decision)."""
        return GridSettings.from_settings(self, lengths, allow_beyond, chat)


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


def scores_by_scoring(grid: dict[str, Any]) -> dict[str, dict[int, float]]:
    """A task grid's score by length for each scoring that ran: ``teacher_forced`` accuracy, ``generated`` score."""
    out: dict[str, dict[int, float]] = {}
    for L, agg in grid["by_length"].items():
        if "teacher_forced" in agg:
            out.setdefault("teacher_forced", {})[int(L)] = agg["teacher_forced"]["accuracy"]
        if "generated" in agg:
            out.setdefault("generated", {})[int(L)] = agg["generated"]["score"]
    return out


def named_effective_lengths(scores: dict[int, float], original: int, min_reference: float) -> dict[str, Any]:
    """The effective length by each named definition (:data:`NAMED_THRESHOLDS`), each with its ``name``.

    Args:
        scores: score (0–1) by length; must include ``original``.
        original: the model's original context.
        min_reference: NoLiMa: the least score at the original length that gives a threshold.
    """
    out = {}
    for key, (label, bar, reference) in NAMED_THRESHOLDS.items():
        out[key] = {"name": label, **effective_length(scores, original, bar, reference, min_reference)}
    return out


def overall_by_scoring(
    by_scoring: dict[str, dict[str, dict[str, float]]],
    tasks: dict[str, Any],
    lengths: list[int],
    original: int,
    min_reference: float,
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, Any]]]:
    """Per scoring: the mean score by length over the tasks, and the named effective lengths of that mean.

    RULER averages every task; NoLiMa's relative threshold needs a reference, so its overall mean takes the
    tasks that have one (as the section's own overall does).
    """
    means: dict[str, dict[str, float]] = {}
    overall: dict[str, dict[str, Any]] = {}
    for scoring, table in by_scoring.items():
        names = list(table)
        mean = {L: sum(table[t][str(L)] for t in names) / len(names) for L in lengths}
        means[scoring] = {str(L): v for L, v in mean.items()}
        named = named_effective_lengths(mean, original, min_reference)
        _, bar, reference = NAMED_THRESHOLDS["nolima"]
        counted = [t for t in names if tasks[t]["effective_lengths"][scoring]["nolima"]["threshold"] is not None]
        if counted:
            ref = {L: sum(table[t][str(L)] for t in counted) / len(counted) for L in lengths}
            named["nolima"] = {"name": named["nolima"]["name"], **effective_length(ref, original, bar, reference)}
        else:
            named["nolima"] = {
                "name": named["nolima"]["name"],
                "length": None,
                "threshold": None,
                "reference_score": None,
                "note": "no task scores at the original length",
            }
        named["ruler"]["tasks"], named["nolima"]["tasks"] = names, counted
        overall[scoring] = named
    return means, overall


def evaluate_ruler(
    loaded: LoadedModel, settings: RulerSettings, show_progress: bool = True, chat: ChatDecision | None = None
) -> dict[str, Any]:
    """Every task of a RULER-style suite on one model, with effective lengths.

    Args:
        loaded: the model.
        settings: tasks, lengths, depths, trials, haystack, templates, threshold.
        show_progress: progress bars.
        chat: ``chat_template: auto`` decided once for every model of a comparison (``None``: for this model).

    Returns:
        The ``ruler`` section of a report: per-task grids, score by task × length, effective lengths.
    """
    settings.check()
    started = time.perf_counter()
    original = loaded.original_length
    # The original length is always evaluated: NoLiMa's threshold is relative to the score there.
    lengths = sorted(set(settings.lengths) | {original})
    hay = load_haystack(loaded, settings.haystack, settings.text_field, settings.split, 2 * max(lengths))
    grid = settings.grid(lengths, settings.allow_beyond_context, chat)
    tasks: dict[str, Any] = {}
    table: dict[str, dict[str, float]] = {}
    by_scoring: dict[str, dict[str, dict[str, float]]] = {}
    for spec in settings.tasks:
        templates = template_indices(spec.task, spec.templates or settings.templates)
        res = evaluate_task_grid(loaded, grid, spec.task, hay, templates, spec.options, show_progress, spec.label)
        if settings.control:
            res["control"] = evaluate_control(loaded, grid, spec.task, hay, templates, spec.options)
        scores = {int(L): e["accuracy"] for L, e in res["by_length"].items()}
        res["effective_length"] = effective_length(
            scores, original, settings.threshold, settings.threshold_reference, settings.min_reference
        )
        res["effective_lengths"] = {}
        for scoring, named in scores_by_scoring(res).items():
            by_scoring.setdefault(scoring, {})[spec.label] = {str(L): v for L, v in named.items()}
            res["effective_lengths"][scoring] = named_effective_lengths(named, original, settings.min_reference)
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
    mean_by, overall_by = overall_by_scoring(by_scoring, tasks, lengths, original, settings.min_reference)
    return {
        "settings": {
            **settings.model_dump(exclude={"tasks"}),
            "tasks": [s.model_dump() for s in settings.tasks],
            "lengths": lengths,
        },
        "original_length": original,
        "haystack": hay.name,
        "scoring": settings.scoring,
        "chat_template": next(iter(tasks.values()))["chat_template"],
        "chat_template_reason": next(iter(tasks.values()))["chat_template_reason"],
        "tasks": tasks,
        "scores": table,
        "mean_by_length": {str(L): v for L, v in mean.items()},
        "effective_length": overall,
        "scores_by": by_scoring,
        "mean_by_length_by": mean_by,
        "effective_lengths": overall_by,
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
