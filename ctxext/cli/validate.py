"""Everything about a recipe that can be checked before training starts (``ctxext validate``, ``ctxext train``).

The schema (:mod:`ctxext.recipe.schema`) checks each value on its own; this checks the recipe against the world:
the model's config, the RoPE plan, the eval suite file, and what the training length means for the model.
A problem found here would otherwise surface only after hours of training (an eval suite that does not
exist) or never (a fine-tune that never sees a position beyond the original window).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ctxext.errors import CtxextError
from ctxext.recipe.schema import Recipe, RecipeError


def check_recipe(
    recipe: Recipe, source: str = "recipe", check_model: bool = True, check_output: bool = False
) -> list[str]:
    """Check a validated recipe against its model, its RoPE plan and its eval suite.

    Args:
        recipe: the validated recipe.
        source: the recipe's name, for messages.
        check_model: read the model's config (local folders and built-ins only: nothing is downloaded).
        check_output: check ``output.dir`` as ``ctxext train`` will (``validate``; ``train`` checks it itself,
            knowing whether it resumes).

    Returns:
        Warnings: settings that run but are probably not what the user wants.

    Raises:
        RecipeError: every problem found, each naming its key.
    """
    problems: list[tuple[str, str]] = []
    warnings: list[str] = []
    if recipe.eval.suite:
        from ctxext.evaluation.suite import find_suite, load_suite

        try:
            load_suite(find_suite(recipe.eval.suite))
        except CtxextError as exc:
            problems.append(("eval.suite", str(exc)))
    _check_data(recipe, problems)
    if check_output:
        _check_output_dir(recipe, source, problems, warnings)
    if check_model:
        _check_model(recipe, problems, warnings)
    # What `train` refuses before loading weights (this machine, LoRA modules, data fields): one function for both.
    from ctxext.training.preflight import preflight_problems

    problems += preflight_problems(recipe, model=check_model)
    if problems:
        raise RecipeError(source, problems)
    return warnings


def _check_data(recipe: Recipe, problems: list[tuple[str, str]]) -> None:
    # data.path, and each corpus of a data.mixture (tasks have no files).
    corpora = [("data.path", recipe.data.path)] + [
        (f"data.mixture[{i}].path", s.path) for i, s in enumerate(recipe.data.mixture or []) if s.path
    ]
    for key, path in corpora:
        if path is not None:
            _check_corpus(key, path, problems)


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


def _check_corpus(key: str, path: str, problems: list[tuple[str, str]]) -> None:
    from ctxext.models.data_sources import looks_like_path
    from ctxext.models.sources import SourceError, check_utf8

    if path.startswith("builtin:"):
        return
    local = Path(path).expanduser()
    if not local.exists():
        if looks_like_path(path):
            problems.append((key, f"{path} does not exist (not a file, a folder, builtin:stdlib or a Hub id)"))
        return  # a Hub data set: not fetched here
    files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
    try:
        check_utf8([f for f in files if not f.name.startswith(".")], key)
    except SourceError as exc:
        problems.append((key, str(exc).removeprefix(f"{key}: ")))


def _check_model(recipe: Recipe, problems: list[tuple[str, str]], warnings: list[str]) -> None:
    from ctxext.errors import InputError
    from ctxext.models.builtin import BUILTIN_PREFIX
    from ctxext.models.gguf import split_gguf_ref
    from ctxext.models.sources import load_config
    from ctxext.rope.plan import plan_extension
    from ctxext.rope.read import read_rope
    from ctxext.rope.types import RopeError

    path = recipe.model.path
    local = Path(path).expanduser()
    try:
        gguf = split_gguf_ref(path) is not None  # a GGUF file: checked and converted by load_config below
    except InputError as exc:
        problems.append(("model.path", str(exc)))
        return
    if not path.startswith(BUILTIN_PREFIX) and not local.exists() and not gguf:
        if path.startswith((".", "/", "~")) or path.count("/") != 1:
            problems.append(("model.path", f"{path} does not exist (not a folder, builtin:NAME or a Hub id org/name)"))
        return  # a Hub id: not fetched here
    from ctxext.models.weights import check_weights_readable

    try:
        config, folder = load_config(path, recipe.model.revision)
        state = read_rope(config, original_length=recipe.model.original_length)
        if folder.is_dir():
            check_weights_readable(folder)
    except InputError as exc:  # SourceError, RopeError and weight problems alike
        problems.append(("model.path", str(exc)))
        return
    seq_len = recipe.seq_len
    if recipe.rope.method == "none":
        if seq_len > state.current_length:
            warnings.append(
                f"rope.method is none but train.seq_len {seq_len} is beyond the model's context "
                f"{state.current_length}: positions past it run with unscaled RoPE (extrapolation), which models "
                "learn poorly; choose a method (yarn, linear …) with rope.target_length"
            )
        return
    target_length = recipe.rope.target_length
    assert target_length is not None  # the recipe schema requires it once a method is set
    if recipe.search is not None:
        plan = _check_search(recipe, config, state, problems)
        if plan is None:
            return
    else:
        try:
            plan = plan_extension(
                config,
                recipe.rope.method,
                target_length,
                recipe.rope.options(),
                recipe.model.original_length,
                recipe.rope.relative_to,
            )
        except RopeError as exc:
            problems.append(("rope", str(exc)))
            return
    # What composing with an existing extension changes (rope.relative_to), said before training.
    warnings.extend(note for note in plan.notes if note.startswith("the model was"))
    # PoSE trains short windows whose position ids reach the target on purpose.
    if seq_len <= plan.original_length and recipe.train.pose is None:
        warnings.append(
            f"train.seq_len {seq_len} is at or below the model's original context {plan.original_length}: the "
            f"fine-tune never sees a position beyond the original window, so it cannot teach the {plan.method} "
            f"extension to {plan.target_length}; raise train.seq_len (default: rope.target_length)"
        )


def _check_search(recipe: Recipe, config: Any, state: Any, problems: list[tuple[str, str]]) -> Any:
    """What the recipe's search checks before it starts (the factors come from it, so none are required).

    Returns:
        A plan of the same lengths (linear: the search's own check of the target), or ``None`` after a problem.
    """
    from ctxext.errors import InputError
    from ctxext.rope.plan import describe_extension, plan_extension
    from ctxext.rope.types import RopeError
    from ctxext.search.recipe import settings_from_recipe

    existing = describe_extension(state)
    if existing:
        problems.append(
            (
                "model.path",
                f"this model is {existing}; the search finds long factors for an unscaled base model: search the "
                "model it was extended from",
            )
        )
        return None
    try:
        settings_from_recipe(recipe).validate_run()
        return plan_extension(config, "linear", int(recipe.rope.target_length or 0), None, recipe.model.original_length)
    except RopeError as exc:
        problems.append(("rope", str(exc)))
    except InputError as exc:
        problems.append(("search", str(exc)))
    return None


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
            f"{' '.join(f'{p:.1f}' for p in d['position_eighths_percent'])}",
        ]
    return lines
