"""The retrieval grids' paired comparison: the same trials for both models, the exact McNemar test.

Every model of a report sees the same seeded samples in every (length, depth) cell, so trials pair: only the
discordant ones (model right and reference wrong, or the reverse) carry evidence. Per length and over all
lengths, :func:`~ctxext.scoring.stats.mcnemar_exact` on them. Rows (``comparisons.grids`` of the report, shared by
``passkey``, ``needle`` and the ``ruler`` tasks, labelled ``ruler/<task>``)::

    {model, task, length: int | "all", trials, a_correct, b_correct, only_a, only_b, difference, p_value, p_holm}

(``a`` is the model, ``b`` the reference). A comparison without a discordant trial cannot reject (its p is 1
whatever happens): the paired driver keeps it out of the Holm family.
"""

from __future__ import annotations

from typing import Any

from ctxext.artifacts.tables import num_text, p_text, table

# Where every retrieval section's rows go in the report's comparisons (one table in report.md).
PAIRED_KEY = "grids"


def mcnemar_rows(
    model: str, task: str, grid: dict[str, Any], other: dict[str, Any], notes: list[str]
) -> list[dict[str, Any]]:
    """McNemar rows of one grid against the reference's grid of the same task, per length and overall.

    Args:
        model: the model's label.
        task: the label of the rows (``passkey``, ``ruler/multikey``).
        grid: the model's grid (``cells`` with per-trial ``outcomes``).
        other: the reference's grid.
        notes: a note is added when the grids cannot be paired (different trial counts).

    Returns:
        JSON-ready rows (none when the grids share no cell).
    """
    from ctxext.scoring.stats import mcnemar_exact

    a_cells = {(c["length"], c["depth"]): c for c in grid.get("cells", []) if "outcomes" in c}
    b_cells = {(c["length"], c["depth"]): c for c in other.get("cells", []) if "outcomes" in c}
    common = sorted(set(a_cells) & set(b_cells))
    if not common:
        return []
    if any(len(a_cells[k]["outcomes"]) != len(b_cells[k]["outcomes"]) for k in common):
        notes.append(f"{model}: {task} not paired (different trial counts per cell)")
        return []
    by_len: dict[int, tuple[list[bool], list[bool]]] = {}
    for k in common:
        xa, xb = by_len.setdefault(k[0], ([], []))
        xa += a_cells[k]["outcomes"]
        xb += b_cells[k]["outcomes"]
    rows = [
        {"model": model, "task": task, "length": L, **mcnemar_exact(xa, xb)} for L, (xa, xb) in sorted(by_len.items())
    ]
    if len(by_len) > 1:
        all_a = [x for xa, _ in by_len.values() for x in xa]
        all_b = [x for _, xb in by_len.values() for x in xb]
        rows.append({"model": model, "task": task, "length": "all", **mcnemar_exact(all_a, all_b)})
    return rows


def mcnemar_markdown(rows: list[dict[str, Any]], reference: str) -> list[str]:
    """The paired-trials table of ``report.md``: correct trials of the model and the reference, the discordant ones."""
    lines = [
        "### Retrieval, paired trials (exact McNemar)",
        "",
        f"Same prompts for both models; only the discordant trials carry evidence: model right / {reference} wrong, "
        "and the reverse.",
        "",
    ]
    cells = [
        [
            r["model"],
            r["task"],
            str(r["length"]),
            f"{r['a_correct']}/{r['trials']}",
            f"{r['b_correct']}/{r['trials']}",
            f"{r['only_a']} / {r['only_b']}",
            f"{num_text(r['difference'], '+.0f', 100)} pts",
            p_text(r["p_value"]),
            p_text(r["p_holm"]),
        ]
        for r in rows
    ]
    header = ["model", "task", "length", "model correct", f"{reference} correct", "discordant (+ / −)", "Δ", "p"]
    return lines + table([*header, "p Holm"], cells)


def mcnemar_summary(rows: list[dict[str, Any]], reference: str) -> list[str]:
    """Console lines: correct trials of both, McNemar p (and Holm's)."""
    return [
        f"paired — {r['model']} vs {reference} {r['task']}@{r['length']}: {r['a_correct']} vs {r['b_correct']} of "
        f"{r['trials']}, McNemar p {r['p_value']:.2g} (Holm {r['p_holm']:.2g})"
        for r in rows
    ]
