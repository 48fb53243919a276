"""Training-free search of per-dimension RoPE rescale factors (LongRoPE-style): ``ctxext search``.

Modules: :mod:`~ctxext.search.factors` (named methods as factors, the seed grid, monotonicity),
:mod:`~ctxext.search.evolution` (the evolutionary search), :mod:`~ctxext.search.objective` (the fitness
sets), :mod:`~ctxext.search.apply` (switching a loaded model's RoPE), :mod:`~ctxext.search.log`
(``search.jsonl`` and resume), :mod:`~ctxext.search.report` (held-out comparison) and
:mod:`~ctxext.search.run` (the workflow). See ``docs/search.md``.
"""

from ctxext.search.run import SearchResult, SearchSettings, parse_budget, run_search

__all__ = ["SearchResult", "SearchSettings", "parse_budget", "run_search"]
