"""A docs YAML block that says it shows the default recipe's settings shows the default recipe's values.

The default recipe (``recipes/default.yaml``) is the one place defaults live; the docs quote parts of it to
explain them. A quoted block is marked by the sentence that follows it (``These are the default recipe's
settings``) and must stay a sub-mapping of the file, so changing the recipe without its docs fails here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ctxext.cli.demo import RECIPE
from tests.helpers import ROOT

MARKER = "These are the default recipe's settings"
_BLOCK = re.compile(r"^```yaml\n(?P<body>.*?)^```\n\s*(?P<after>[^\n]*)", flags=re.M | re.S)


def _quoted_blocks(markdown: str) -> Iterator[str]:
    """The bodies of the ```yaml blocks followed by the marker sentence."""
    for match in _BLOCK.finditer(markdown):
        if match["after"].startswith(MARKER):
            yield match["body"]


def _differences(quoted: Any, recipe: Any, path: str = "") -> list[str]:
    """Where ``quoted`` is not a sub-mapping of ``recipe``: ``key: docs X, recipe Y`` per leaf."""
    if isinstance(quoted, dict):
        if not isinstance(recipe, dict):
            return [f"{path}: docs a mapping, recipe {recipe!r}"]
        return [
            problem
            for key, value in quoted.items()
            for problem in (
                _differences(value, recipe[key], f"{path}.{key}".lstrip("."))
                if key in recipe
                else [f"{path}.{key}".lstrip(".") + ": not in the recipe"]
            )
        ]
    return [] if quoted == recipe else [f"{path}: docs {quoted!r}, recipe {recipe!r}"]


def _doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_some_page_quotes_the_default_recipe() -> None:
    # Without this, renaming the marker sentence would make the rule below pass on nothing.
    assert any(list(_quoted_blocks(page.read_text())) for page in _doc_pages())


@pytest.mark.parametrize("page", _doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_quoted_recipe_blocks_match_the_default_recipe(page: Path) -> None:
    recipe = yaml.safe_load(RECIPE.read_text())
    for body in _quoted_blocks(page.read_text()):
        problems = _differences(yaml.safe_load(body), recipe)
        assert not problems, f"{page.relative_to(ROOT)} quotes {RECIPE.name} wrongly: " + "; ".join(problems)


def test_the_rule_catches_a_changed_value() -> None:
    recipe = yaml.safe_load(RECIPE.read_text())
    page = "```yaml\ntrain:\n  max_steps: 7\n  nope: 1\n```\n\n" + MARKER + " (...)\n"
    (body,) = _quoted_blocks(page)
    problems = _differences(yaml.safe_load(body), recipe)
    assert problems == [
        f"train.max_steps: docs 7, recipe {recipe['train']['max_steps']!r}",
        "train.nope: not in the recipe",
    ]
