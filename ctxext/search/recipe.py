"""The recipe's ``search:`` section: a factor search before training, or ``ctxext search --recipe``.

A recipe with ``rope.method: longrope`` and a ``search:`` section (and no factors of its own) runs the
search into ``search.out`` (default ``<output.dir>-search``) and trains from its result: the found long
factors, short factors 1 and attention factor 1 are written into ``rope`` before training starts. A
search folder that is already complete is reused (so ``ctxext train --resume`` does not search again);
an interrupted one is resumed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ctxext.errors import InputError


def _search_out(recipe: Any, out: Path | None) -> Path:
    if out is not None:
        return Path(out)
    if recipe.search.out:
        return Path(recipe.search.out)
    return Path(f"{recipe.output.dir.rstrip('/')}-search")


def settings_from_recipe(recipe: Any, out: Path | None = None, given: Mapping[str, Any] | None = None) -> Any:
    """The :class:`~ctxext.search.run.SearchSettings` of a recipe's ``model`` / ``rope`` / ``search`` sections.

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


def search_before_training(recipe: Any, log: Callable[[str], None] = print) -> Any:
    """Run (or reuse, or resume) the recipe's search and put its factors into ``rope``.

    Args:
        recipe: a validated recipe with a ``search`` section.
        log: receives progress lines.

    Returns:
        The recipe, with ``rope.short_factor`` / ``long_factor`` / ``attention_factor`` set.
    """
    from ctxext.search.apply import longrope_options
    from ctxext.search.log import LOG_NAME
    from ctxext.search.run import run_search

    settings = settings_from_recipe(recipe)
    factors_file = settings.out / "factors.json"
    if (settings.out / "config.json").is_file() and factors_file.is_file():
        log(f"using the completed search in {settings.out}")
        long_factor = json.loads(factors_file.read_text())["long_factor"]
    else:
        settings.resume = (settings.out / LOG_NAME).is_file()
        long_factor = run_search(settings, log=log).long_factor
    written = json.loads((settings.out / "config.json").read_text())["rope_parameters"]
    options = longrope_options(long_factor, float(written.get("attention_factor", 1.0)))
    recipe.rope.short_factor = options["short_factor"]
    recipe.rope.long_factor = options["long_factor"]
    recipe.rope.attention_factor = options["attention_factor"]
    return recipe
