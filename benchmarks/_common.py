"""Helpers that several benchmarks share and the package does not have (statistics come from the package).

Import as ``from benchmarks._common import …`` (the scripts put the repository root on ``sys.path``).
"""

from __future__ import annotations

from typing import Any


def mcnemar_vs_reference(a: list[int], b: list[int]) -> dict[str, Any]:
    """Exact two-sided McNemar test of a model's 0/1 outcomes ``a`` against the reference's ``b``, trial for trial.

    :func:`ctxext.evaluation.stats.mcnemar_exact` computes it; this keeps the keys the benchmarks' results
    were written with.

    Returns:
        ``only_this`` (``a`` right, ``b`` wrong), ``only_reference`` and ``p_value``.
    """
    from ctxext.evaluation.stats import mcnemar_exact

    test = mcnemar_exact([bool(x) for x in a], [bool(y) for y in b])
    return {"only_this": test["only_a"], "only_reference": test["only_b"], "p_value": test["p_value"]}
