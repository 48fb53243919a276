"""Everything about a recipe that can be checked before training starts (``ctxext validate``, ``ctxext train``).

The schema (:mod:`ctxext.recipe.schema`) checks each value on its own. What ``train`` refuses before it loads a
model (this machine, the model's config, the RoPE plan, the data sources) is decided by
:mod:`ctxext.recipe.refusals`, which ``train`` runs itself; this adds what belongs to other workflows: the eval suite
file, the output folder, a search section's settings. A problem found here would otherwise surface only after hours
of training (an eval suite that does not exist) or never (a fine-tune that never sees a position beyond the
original window).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from ctxext.errors import CtxextError
from ctxext.recipe.schema import Recipe, RecipeError


def check_recipe(recipe: Recipe, source: str = "recipe", check_output: bool = False) -> list[str]:
    """Check a validated recipe against this machine, its model, its RoPE plan, its data and its eval suite.

    Args:
        recipe: the validated recipe.
        source: the recipe's name, for messages.
        check_output: check ``output.dir`` as ``ctxext train`` will (``validate``; ``train`` checks it itself,
            knowing whether it resumes).

    Returns:
        Warnings: settings that run but are probably not what the user wants.

    Raises:
        RecipeError: every problem found, each naming its key.
    """
    from ctxext.recipe.refusals import refusals

    problems: list[tuple[str, str]] = []
    warnings: list[str] = []
    if recipe.eval.suite:
        from ctxext.evaluation.suite import find_suite, load_suite

        try:
            load_suite(find_suite(recipe.eval.suite))
        except CtxextError as exc:
            problems.append(("eval.suite", str(exc)))
    if check_output:
        _check_output_dir(recipe, source, problems, warnings)
    # What `train` refuses before it loads a model: one function for both commands.
    checked = refusals(recipe)
    problems += checked.problems
    warnings += checked.warnings
    if recipe.search is not None:
        _check_search(recipe, problems)
    if problems:
        raise RecipeError(source, problems)
    return warnings + _launch_warnings(recipe)


def _launch_warnings(recipe: Recipe) -> list[str]:
    """What the launch must provide: ``validate`` cannot know how many processes ``train`` will be started with."""
    cfg = recipe.train
    group = cfg.sequence_parallel_size * cfg.context_parallel_size
    if group == 1 or int(os.environ.get("WORLD_SIZE", "1")) % group == 0:
        return []
    return [
        f"a sequence split over {group} processes: `ctxext train` must be launched on a multiple of {group} "
        f"(e.g. `accelerate launch --num_processes {group} -m ctxext train ...`); a single process refuses it"
    ]


def _check_output_dir(recipe: Recipe, source: str, problems: list[tuple[str, str]], warnings: list[str]) -> None:
    # The same check `train` makes before loading anything, so that validate never passes what train refuses.
    from ctxext.errors import InputError
    from ctxext.recipe.schema import dump_recipe
    from ctxext.training.folder import check_output_dir, run_status

    out = Path(recipe.output.dir)
    resume = run_status(out) not in (None, "complete")  # an unfinished run: train --resume continues it
    try:
        check_output_dir(out, dump_recipe(recipe), resume=resume, search_folder=recipe.search_folder())
    except InputError as exc:
        text = str(exc)
        if resume:  # its messages speak of train's --resume, which validate does not have
            text = f"`ctxext train {shlex.quote(source)} --resume` would refuse it: " + text.removeprefix("--resume: ")
        problems.append(("output.dir", text.removeprefix("output.dir: ").removeprefix("output.dir ")))
        return
    if resume:
        warnings.append(
            f"output.dir {out} holds an unfinished run of this recipe: `ctxext train {shlex.quote(source)} --resume` "
            "continues it; a new run needs another output.dir"
        )


def _check_search(recipe: Recipe, problems: list[tuple[str, str]]) -> None:
    """The settings of the recipe's search (the base and the plan are :mod:`ctxext.recipe.refusals`' part)."""
    from ctxext.errors import InputError
    from ctxext.search.recipe import settings_from_recipe

    try:
        settings_from_recipe(recipe).validate_run()
    except InputError as exc:
        problems.append(("search", str(exc)))


def distance_lines(recipe: Recipe, source: str = "recipe") -> list[str]:
    """Two lines per task source of a mixture: its needle distances and positions (eighths of the span, percent).

    Built from the first rows of each task source on a noise haystack with the model's tokenizer; nothing is
    downloaded (a Hub model gives no lines).

    Raises:
        RecipeError: a distance span the rows cannot meet, or a task that cannot fit, naming the key.
    """
    from ctxext.errors import InputError

    if not any(s.task for s in recipe.data.mixture or []):
        return []
    from ctxext.models.builtin import BUILTIN_PREFIX

    path = recipe.model.path
    if not path.startswith(BUILTIN_PREFIX) and not Path(path).expanduser().is_dir():
        return []
    from transformers import AutoTokenizer

    from ctxext.models.sources import load_config
    from ctxext.training.data.mixture import preview_task_distances

    _, folder = load_config(path, recipe.model.revision)
    try:
        previews = preview_task_distances(recipe, AutoTokenizer.from_pretrained(folder))
    except InputError as exc:
        key, _, message = str(exc).partition(": ")
        raise RecipeError(source, [(key, message)]) from None
    lines = []
    for key, d in previews.items():
        lines += [
            f"{key} needle distances ({d['distribution']}, 0–{d['span']} {d['unit']}, {d['samples']} samples), "
            f"percent per eighth: {' '.join(f'{p:.1f}' for p in d['eighths_percent'])} (expected "
            f"{' '.join(f'{p:.1f}' for p in d['expected_percent'])})",
            f"{key} needle positions ({d['placement']}), percent per eighth: "
            f"{' '.join(f'{p:.1f}' for p in d['position_eighths_percent'])}" + _packed_pose(recipe, d["span"]),
        ]
    return lines


def _packed_pose(recipe: Recipe, span: int) -> str:
    """A hint when PoSE rows pack their needles: none sits past the row's own tokens, where evaluation puts them."""
    if recipe.data.task_position != "packed" or recipe.train.pose is None:
        return ""
    return (
        f" (packed with PoSE: no needle sits past position {recipe.seq_len:,} of {span:,}; "
        "data.task_position=uniform spreads them, docs/training.md)"
    )
