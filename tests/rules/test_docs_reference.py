"""The generated reference pages (docs/reference) are the code's: a new recipe key, section or flag updates them."""

from __future__ import annotations

from ctxext.cli.reference import PAGES, main, recipe_page
from tests.helpers import ROOT


def test_the_committed_reference_pages_are_current(capsys):
    assert main([str(ROOT / "docs" / "reference"), "--check"]) == 0, capsys.readouterr().out


def test_a_stale_page_is_named(tmp_path, capsys):
    main([str(tmp_path)])
    (tmp_path / "recipe.md").write_text(recipe_page().replace("`train.seq_len`", "`train.old_name`"))
    assert main([str(tmp_path), "--check"]) == 1
    assert f"stale reference pages: {tmp_path / 'recipe.md'}" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PAGES)


def test_the_api_page_lists_every_exported_name_and_each_imports():
    import re

    import ctxext

    page = (ROOT / "docs" / "reference" / "api.md").read_text()
    listed = re.findall(r"^### `([^`]+)`$", page, flags=re.M)
    assert sorted(listed) == sorted(ctxext._LAZY), "docs/reference/api.md and ctxext._LAZY differ"
    for name in listed:
        assert f"from ctxext import {name}\n" in page
        assert getattr(ctxext, name) is not None, name
