"""The no-needle control of a retrieval grid: the same prompts with their evidence removed (the chance rate).

A task's accuracy means little without the rate at which a model produces the answer *without* the needle:
a fixed needle a model was fine-tuned on (or an answer guessable from the question) scores high with no
retrieval at all. The control takes each length's trials at the grid's middle depth, replaces every insert
(the needle, the distractors, the JSON object, the documents' headers and definitions) with the haystack
tokens that follow the sample's own filler — so the length, the question and the answer are unchanged — and
scores them exactly as the grid does (teacher-forced and/or generated). Reported per length and overall,
correct / trials with a 95 % Wilson interval.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ctxext.evaluation.sections.grids.engine import GridSettings, model_chat, score_trials
from ctxext.models.load import LoadedModel
from ctxext.scoring.stats import wilson_interval
from ctxext.tasks import Haystack, TaskSample, Template
from ctxext.tasks.samples import make_samples

CONTROL_NOTE = (
    "no-needle control: each length's trials at the middle depth, every insert (needle, distractors, object) "
    "replaced by the haystack tokens that follow the sample's filler; same length, question and answer, scored the "
    "same way: how often the answer comes without its evidence (the chance rate)"
)


def control_sample(sample: TaskSample, haystack: Haystack) -> TaskSample:
    """The sample with every insert replaced by haystack tokens: same length, question and answer, no evidence."""
    ids = list(sample.ids)
    at = sample.haystack_offset + sample.filler_tokens  # the text right after the sample's own filler
    for start, end in sample.needle_spans:
        ids[start:end] = haystack.take(end - start, at)
        at += end - start
    return dataclasses.replace(sample, ids=ids, needle_spans=[], needle_span=None)


def evaluate_control(
    loaded: LoadedModel,
    settings: GridSettings,
    task: str,
    haystack: Haystack,
    template: int | Template | list[int] = 0,
    options: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The no-needle control of a task grid (:data:`CONTROL_NOTE`): per length, correct / trials with Wilson CI.

    Args:
        loaded: the model.
        settings: the grid's settings (lengths, trials, seed, scoring); the middle depth of ``depths`` is used.
        task: the registered task.
        haystack: the grid's haystack.
        template: the grid's template choice.
        options: task options.

    Returns:
        ``{"note", "depth", "by_length": {L: accuracy entry}, "overall"}``; a task that inserts nothing
        has only a ``note``.
    """
    chat, _ = model_chat(loaded, settings.chat_template, settings.chat_decision)
    depth = float(sorted(settings.depths)[len(settings.depths) // 2])
    by_length: dict[str, Any] = {}
    outcomes: list[int] = []
    for L in sorted({int(x) for x in settings.lengths}):
        samples = make_samples(
            loaded.tokenizer,
            task,
            haystack,
            L,
            depth,
            trials=settings.trials,
            seed=settings.seed,
            template=template,
            options=options,
            chat=chat,
        )
        if not samples[0].needle_spans:
            return {"note": f"task {task} inserts nothing into the haystack: no control"}
        results = score_trials(loaded, [control_sample(s, haystack) for s in samples], settings)
        cell = [int(r["correct"]) for r in results]
        by_length[str(L)] = _accuracy(cell)
        outcomes += cell
    return {"note": CONTROL_NOTE, "depth": depth, "by_length": by_length, "overall": _accuracy(outcomes)}


def _accuracy(outcomes: list[int]) -> dict[str, Any]:
    correct, trials = sum(outcomes), len(outcomes)
    low, high = wilson_interval(correct, trials)
    return {"correct": correct, "trials": trials, "accuracy": correct / trials, "ci_low": low, "ci_high": high}


def control_markdown(models: list[dict[str, Any]]) -> list[str]:
    """``report.md`` lines: each RULER task's no-needle control per model (none when no control ran).

    Args:
        models: report model entries (JSON form) with a ``ruler`` section.
    """
    from ctxext.artifacts.tables import table

    tasks = [
        t for t in models[0]["ruler"]["tasks"] if any(m["ruler"]["tasks"].get(t, {}).get("control") for m in models)
    ]
    if not tasks:
        return []
    rows = []
    for t in tasks:
        row = [t]
        for m in models:
            c = m["ruler"]["tasks"].get(t, {}).get("control") or {}
            o = c.get("overall")
            row.append(
                f"{o['accuracy'] * 100:.0f} % [{o['ci_low'] * 100:.0f}, {o['ci_high'] * 100:.0f}] ({o['trials']})"
                if o
                else c.get("note", "–")
            )
        rows.append(row)
    lines = ["### No-needle control (chance rate)", "", CONTROL_NOTE[0].upper() + CONTROL_NOTE[1:] + ".", ""]
    return lines + table(["task", *[m["name"] for m in models]], rows)
