"""Training-free search of per-dimension RoPE rescale factors (LongRoPE-style): ``ctxext search``.

Modules: :mod:`~ctxext.search.factors` (named methods as factors, the seed grid, monotonicity),
:mod:`~ctxext.search.evolution` (the evolutionary search), :mod:`~ctxext.search.objective` (the fitness
sets), :mod:`~ctxext.search.forms` (the needle forms the base retrieves inside its window),
:mod:`~ctxext.search.apply` (switching a loaded model's RoPE), :mod:`~ctxext.search.log`
(``search.jsonl`` and resume), :mod:`~ctxext.scoring.windows` (the in-window cost, paired with the base),
:mod:`~ctxext.search.report` (held-out comparison),
:mod:`~ctxext.search.recipe` (the recipe's ``search:`` section), :mod:`~ctxext.search.settings` (what to
search, what was found), :mod:`~ctxext.search.session` (one session: evolution, log, clocks) and
:mod:`~ctxext.search.run` (the workflow). See ``docs/search.md``. Names load on first use, so the recipe
schema can import the budget parser without torch.
"""

import importlib
from typing import Any

_LAZY = {
    "SearchResult": "ctxext.search.settings",
    "SearchSettings": "ctxext.search.settings",
    "run_search": "ctxext.search.run",
    "parse_budget": "ctxext.recipe.budget",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ctxext.search' has no attribute {name!r}")


__all__ = list(_LAZY)
