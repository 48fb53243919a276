"""The recipe's ``search:`` section: a factor search before training, or ``ctxext search --recipe``.

A recipe with ``rope.method: longrope`` and a ``search:`` section (and no factors of its own) runs the
search into ``search.out`` — by default ``<output.dir>/search``, inside the run folder — and trains from its
result: the found long factors, short factors 1 and the search's attention factor are written into
``rope``, and the recipe the run records (``recipe.yaml``) is that resolved one, without the ``search:``
section, so it reproduces the training by itself. ``run.json`` records the search under ``search``.

A search folder that is already complete is reused (so ``ctxext train --resume`` does not search again); an
interrupted one is resumed by running the same ``ctxext train`` again.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxext.errors import InputError

# What run.json records about the search (from the search folder's search.json).
_RECORDED = ("score", "best_seed", "evaluations", "ended", "seconds", "attention_factor")


def _search_out(recipe: Any, out: Path | None) -> Path:
    if out is not None:
        return Path(out)
    return recipe.search_folder()  # search.out, by default <output.dir>/search


def settings_from_recipe(recipe: Any, out: Path | None = None, given: Mapping[str, Any] | None = None) -> Any:
    """The :class:`~ctxext.search.settings.SearchSettings` of a recipe's ``model`` / ``rope`` / ``search`` sections.

    Args:
        recipe: a validated :class:`ctxext.recipe.schema.Recipe`.
        out: overrides ``search.out``.
        given: search settings that override the section's (the flags of ``ctxext search --recipe``).

    Raises:
        InputError: the recipe has no ``search`` section or no target length, or a given value is invalid.
    """
    from ctxext.recipe.flags import build_settings
    from ctxext.search.run import SearchSettings

    if recipe.search is None:
        raise InputError("the recipe has no search: section (see docs/search.md for its keys)")
    if recipe.rope.target_length is None:
        raise InputError("rope.target_length: the search needs a target length")
    run = {
        "model": recipe.model.path,
        "target_length": int(recipe.rope.target_length),
        "out": _search_out(recipe, out),
        "original_length": recipe.model.original_length,
    }
    # The section's keys are the declared search options (SearchSection = SearchOptions + out).
    section = recipe.search.model_dump(exclude={"out"})
    return build_settings(SearchSettings, dict(given or {}), {**section, **run})


@dataclass
class SearchedRecipe:
    """A recipe whose search is done.

    Attributes:
        recipe: the recipe to train: ``rope`` holds the found factors, the ``search`` section is removed.
        record: what ``run.json`` records under ``search`` (the folder, objective, score, best seed …).
    """

    recipe: Any
    record: dict[str, Any]


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` holds a finished search (the model folder with its factors and summary)."""
    return all((folder / name).is_file() for name in ("config.json", "factors.json", "search.json"))


def search_before_training(recipe: Any, log: Callable[[str], None] = print) -> SearchedRecipe:
    """Run (or reuse, or resume) the recipe's search and put its factors into ``rope``.

    Args:
        recipe: a validated recipe with a ``search`` section.
        log: receives progress lines.

    Returns:
        The :class:`SearchedRecipe` (a copy of ``recipe``: the argument is not changed).

    Raises:
        InputError: a run folder that holds more than this search, or a multi-process launch with no finished
            search (the search runs in one process).
    """
    from ctxext.search.apply import longrope_options
    from ctxext.search.log import LOG_NAME
    from ctxext.search.run import run_search

    settings = settings_from_recipe(recipe)
    folder = Path(settings.out)
    if is_complete(folder):
        log(f"using the completed search in {folder}")
    else:
        _check_can_search(recipe, folder)
        with _run_folder_lock(recipe, folder):
            settings.resume = (folder / LOG_NAME).is_file()
            run_search(settings, log=log)
    summary = json.loads((folder / "search.json").read_text())
    long_factor = json.loads((folder / "factors.json").read_text())["long_factor"]
    written = json.loads((folder / "config.json").read_text())["rope_parameters"]
    options = longrope_options(long_factor, float(written.get("attention_factor", 1.0)))
    trained = recipe.model_copy(deep=True)
    trained.rope.short_factor = options["short_factor"]
    trained.rope.long_factor = options["long_factor"]
    trained.rope.attention_factor = options["attention_factor"]
    trained.search = None  # resolved: recipe.yaml holds the factors, run.json the search
    record = {"folder": str(folder), "objective": summary.get("settings", {}).get("objective")}
    record.update({key: summary.get(key) for key in _RECORDED})
    return SearchedRecipe(trained, record)


def _inside_run(recipe: Any, folder: Path) -> bool:
    return Path(os.path.abspath(folder)).parent == Path(os.path.abspath(recipe.output.dir))


def _check_can_search(recipe: Any, folder: Path) -> None:
    """Before any search work: one process, and a run folder that holds nothing but this search."""
    from ctxext.artifacts.lock import LOCK_SUFFIX

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise InputError(
            f"search: {folder} holds no finished search, and the search runs in one process. Run it first with "
            f"`ctxext search --recipe RECIPE --out {shlex.quote(str(folder))}` (the recipe you launched), then "
            "launch the training again: it reuses the finished search"
        )
    out = Path(recipe.output.dir)
    if not _inside_run(recipe, folder) or not out.is_dir():
        return
    ours = {folder.name, f".{folder.name}{LOCK_SUFFIX}"}
    other = sorted(p.name for p in out.iterdir() if p.name not in ours)
    if other:
        raise InputError(
            f"output.dir: {out} already exists and holds more than this recipe's search ({', '.join(other[:5])}); "
            "choose another output.dir"
        )


def _run_folder_lock(recipe: Any, folder: Path) -> AbstractContextManager[Any]:
    """The run folder's lock while its search runs inside it, so a second ``train`` into it is refused at once."""
    from ctxext.artifacts.lock import folder_lock

    if not _inside_run(recipe, folder):
        return nullcontext()
    return folder_lock(Path(recipe.output.dir), flag="output.dir")
