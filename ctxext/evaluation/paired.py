"""Paired model-vs-reference comparisons of a report: the same documents, the same trials.

Documents and trials differ from one another far more than models do, so two per-model intervals overlap
even when one model is better on nearly every item. Compared on the same items, the differences that are
real show up. Each registered suite section pairs its own results
(:meth:`~ctxext.evaluation.sections.base.SuiteSection.paired`): perplexity ratios on the same documents
(``sections/perplexity/paired.py``), the exact McNemar test on the same retrieval trials (``sections/grids/paired.py``,
shared by ``passkey``, ``needle`` and the ``ruler`` tasks), the share of attention beyond the original window
(``sections/attention``), a plugin's own. This driver collects every section's rows under the section's
``paired_key`` and Holm-adjusts every p-value of the report together, recording the number of comparisons:
with dozens of cells, a few raw p < 0.05 are expected by chance.

The ``comparisons`` section of ``report.json``::

    {"reference": str, "comparisons": int, "correction": "holm", "notes": [str],
     "<paired key>": [{model, …, p_value, p_holm}], …}
"""

from __future__ import annotations

from typing import Any

from ctxext.errors import InputError
from ctxext.scoring.stats import DEFAULT_RESAMPLES, holm


def choose_reference(models: list[dict[str, Any]], reference: str | None) -> str:
    """The reference model's name: ``reference`` if given (must be one of the models), else the first model.

    Raises:
        InputError: ``reference`` names no model of the report.
    """
    names = [m["name"] for m in models]
    if reference is None:
        return names[0]
    if reference not in names:
        raise InputError(f"--reference {reference!r} is not a model of this report; models: {', '.join(names)}")
    return reference


def compare_models(
    models: list[dict[str, Any]], reference: str | None = None, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> dict[str, Any] | None:
    """Every model against the reference, paired by every registered section, with Holm-adjusted p-values.

    Args:
        models: report model entries (from :func:`ctxext.evaluation.report.model_entry` plus section parts).
        reference: name of the reference model (default: the first model).
        resamples: bootstrap resamples.
        seed: RNG seed.

    Returns:
        The ``comparisons`` section, or None with fewer than two models.
    """
    if len(models) < 2:
        return None
    ref_name = choose_reference(models, reference)
    ref = next(m for m in models if m["name"] == ref_name)
    notes: list[str] = []
    from ctxext.evaluation.sections import SECTIONS

    by_key: dict[str, list[dict[str, Any]]] = {}
    for m in models:
        if m is ref:
            continue
        for key, registered in SECTIONS.items():
            if m.get(key) and ref.get(key):
                found = registered.paired(m, ref, resamples, seed, notes)
                by_key.setdefault(registered.paired_key or key, []).extend(found)
    by_key = {key: rows for key, rows in by_key.items() if rows}
    rows = [row for found in by_key.values() for row in found]
    # Comparisons of paired outcomes without a discordant trial cannot reject (p is 1 whatever happens): they stay
    # out of the Holm family, or a suite of tasks every model fails would dilute every real difference.
    family = [r for r in rows if r["p_value"] == r["p_value"] and r.get("only_a", 1) + r.get("only_b", 1) > 0]
    for row in rows:
        row["p_holm"] = 1.0 if row["p_value"] == row["p_value"] else row["p_value"]
    for row, p in zip(family, holm([r["p_value"] for r in family]), strict=True):
        row["p_holm"] = p
    untestable = sum(1 for r in rows if r.get("only_a", 1) + r.get("only_b", 1) == 0)
    if untestable:
        notes.append(
            f"{untestable} retrieval comparison(s) without a discordant trial (p = 1 whatever the models do) "
            "are left out of the Holm family"
        )
    return {"reference": ref_name, "comparisons": len(family), "correction": "holm", "notes": notes, **by_key}
