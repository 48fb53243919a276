"""Paired model-vs-reference comparisons of a report: the same documents, the same trials.

Documents differ from one another far more than models do, so two per-model intervals overlap even
when one model is better on nearly every document. Compared on the same documents (documents
resampled jointly for both models) and the same trials, the differences that are real show up:

* perplexity, per evaluation length and per position bucket: the ratio ``ppl(model) / ppl(reference)``
  with a 95 % paired bootstrap interval and a two-sided p-value from the bootstrap standard error
  (:func:`~ctxext.scoring.stats.paired_ppl_ratio`); documents are
  matched by a hash of their tokens, so models with different tokenizers are not paired (and say so);
* retrieval grids (any task section with ``cells`` holding ``outcomes``), per length and overall:
  the exact McNemar test on the discordant trials (:func:`~ctxext.scoring.stats.mcnemar_exact`);
* attention diagnostics (its section, :mod:`ctxext.evaluation.sections.attention`): the difference in the
  share of attention beyond the original window (mean over layers), paired bootstrap over documents;
* every p-value of a report is also Holm-adjusted over all the comparisons the report makes, and the
  number of comparisons is recorded: with dozens of cells, a few raw p < 0.05 are expected by chance;
* a registered suite section (:mod:`ctxext.evaluation.sections`) pairs its own results
  (:meth:`~ctxext.evaluation.sections.SuiteSection.paired`): its rows are stored under its name and join
  the Holm family.

The ``comparisons`` section of ``report.json``::

    {"reference": str, "comparisons": int, "correction": "holm", "notes": [str],
     "perplexity": [{model, view: "length" | "bucket", length | start/end, ratio, ci_low, ci_high,
                     p_value, p_holm, documents}],
     "grids": [{model, task, length: int | "all", trials, a_correct, b_correct, only_a, only_b,
                difference, p_value, p_holm}],
     "attention": [{model, length, difference, ci_low, ci_high, p_value, p_holm, documents}],
     "<section>": [{model, …, p_value, p_holm}]}

(in grid rows ``a`` is the model, ``b`` the reference).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxext.errors import InputError
from ctxext.scoring.stats import DEFAULT_RESAMPLES, holm, mcnemar_exact, paired_ppl_ratio


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
    """Every model against the reference, paired, with Holm-adjusted p-values.

    Args:
        models: report model entries (from :func:`ctxext.evaluation.report.model_entry` plus task sections).
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
    ppl_rows: list[dict[str, Any]] = []
    grid_rows: list[dict[str, Any]] = []
    from ctxext.evaluation.sections import SECTIONS

    section_rows: dict[str, list[dict[str, Any]]] = {}
    for m in models:
        if m is ref:
            continue
        ppl_rows += _ppl_rows(m, ref, resamples, seed, notes)
        grid_rows += _grid_rows(m, ref, notes)
        for key, registered in SECTIONS.items():  # a registered section pairs its own results
            if m.get(key) and ref.get(key):
                section_rows.setdefault(key, []).extend(registered.paired(m, ref, resamples, seed, notes))
    section_rows = {key: rows for key, rows in section_rows.items() if rows}
    rows = ppl_rows + grid_rows + [row for found in section_rows.values() for row in found]
    # Retrieval comparisons without a discordant trial cannot reject (p is 1 whatever happens): they stay
    # out of the Holm family, or a suite of tasks every model fails would dilute every real difference.
    family = [r for r in rows if r["p_value"] == r["p_value"] and r.get("only_a", 1) + r.get("only_b", 1) > 0]
    for row in rows:
        row["p_holm"] = 1.0 if row["p_value"] == row["p_value"] else row["p_value"]
    for row, p in zip(family, holm([r["p_value"] for r in family]), strict=True):
        row["p_holm"] = p
    untestable = sum(1 for r in grid_rows if r["only_a"] + r["only_b"] == 0)
    if untestable:
        notes.append(
            f"{untestable} retrieval comparison(s) without a discordant trial (p = 1 whatever the models do) "
            "are left out of the Holm family"
        )
    return {
        "reference": ref_name,
        "comparisons": len(family),
        "correction": "holm",
        "notes": notes,
        "perplexity": ppl_rows,
        "grids": grid_rows,
        "attention": [],  # the attention section's rows (sections/attention.py), in their place of the schema
        **section_rows,
    }


def _pair(a: dict[str, Any], a_keys: list[str], b: dict[str, Any], b_keys: list[str]) -> list[tuple[int, int]]:
    # Positions (in a's and b's per-document lists) of the documents both scored, matched by content.
    b_pos = {b_keys[d]: i for i, d in enumerate(b["docs"])}
    return [(i, b_pos[a_keys[d]]) for i, d in enumerate(a["docs"]) if a_keys[d] in b_pos]


def _protocol(mode: str | None) -> str | None:
    # One-pass and per-length scoring compute the same truncated-document NLLs (one pass serves every
    # length for static RoPE; length-dependent RoPE needs a pass per length); sliding windows differ.
    return "truncated" if mode in ("one-pass", "per-length") else mode


def _ppl_rows(m: dict[str, Any], ref: dict[str, Any], resamples: int, seed: int, notes: list[str]) -> list[dict]:
    pa, pb = m.get("perplexity") or {}, ref.get("perplexity") or {}
    da, db = pa.get("per_document"), pb.get("per_document")
    if not da or not db:
        return []
    if _protocol(pa.get("mode")) != _protocol(pb.get("mode")):
        notes.append(f"{m['name']}: perplexity not paired (mode {pa.get('mode')} vs {pb.get('mode')})")
        return []
    rows: list[dict[str, Any]] = []
    for L, a in da["by_length"].items():
        b = db["by_length"].get(L)
        if b is None:
            continue
        pairs = _pair(a, da["keys"], b, db["keys"])
        if not pairs:
            notes.append(
                f"{m['name']}: no document in common with {ref['name']} at {L} tokens (different tokenizers or data)"
            )
            continue
        ia, ib = (list(x) for x in zip(*pairs, strict=True))
        stat = paired_ppl_ratio(
            np.array(a["nll_sums"])[list(ia)],
            np.array(b["nll_sums"])[list(ib)],
            np.array(a["tokens"])[list(ia)],
            resamples,
            seed,
        )
        rows.append({"model": m["name"], "view": "length", "length": int(L), **stat})
    ba, bb = da.get("buckets"), db.get("buckets")
    if ba and bb and ba["edges"] == bb["edges"]:
        pairs = _pair(ba, da["keys"], bb, db["keys"])
        if pairs:
            ia, ib = (list(x) for x in zip(*pairs, strict=True))
            for j, (start, end) in enumerate(ba["edges"]):
                stat = paired_ppl_ratio(
                    np.array(ba["nll_sums"][j])[ia],
                    np.array(bb["nll_sums"][j])[ib],
                    np.full(len(ia), ba["tokens"][j]),
                    resamples,
                    seed,
                )
                rows.append({"model": m["name"], "view": "bucket", "start": start, "end": end, **stat})
    return rows


def _grids(m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    # Every retrieval grid of a model entry: top-level sections (passkey, needle, …) and the RULER-style
    # suite's tasks (labelled "ruler/<task>").
    out = {k: v for k, v in m.items() if isinstance(v, dict) and "cells" in v}
    ruler = m.get("ruler")
    if isinstance(ruler, dict):
        out |= {f"ruler/{k}": v for k, v in (ruler.get("tasks") or {}).items() if isinstance(v, dict) and "cells" in v}
    return out


def _grid_rows(m: dict[str, Any], ref: dict[str, Any], notes: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    ref_grids = _grids(ref)
    for task, section in _grids(m).items():
        other = ref_grids.get(task)
        if other is None:
            continue
        a_cells = {(c["length"], c["depth"]): c for c in section["cells"] if "outcomes" in c}
        b_cells = {(c["length"], c["depth"]): c for c in other.get("cells", []) if "outcomes" in c}
        common = sorted(set(a_cells) & set(b_cells))
        if not common:
            continue
        if any(len(a_cells[k]["outcomes"]) != len(b_cells[k]["outcomes"]) for k in common):
            notes.append(f"{m['name']}: {task} not paired (different trial counts per cell)")
            continue
        by_len: dict[int, tuple[list[bool], list[bool]]] = {}
        for k in common:
            xa, xb = by_len.setdefault(k[0], ([], []))
            xa += a_cells[k]["outcomes"]
            xb += b_cells[k]["outcomes"]
        all_a = [x for xa, _ in by_len.values() for x in xa]
        all_b = [x for _, xb in by_len.values() for x in xb]
        for L, (xa, xb) in sorted(by_len.items()):
            rows.append({"model": m["name"], "task": task, "length": L, **mcnemar_exact(xa, xb)})
        if len(by_len) > 1:
            rows.append({"model": m["name"], "task": task, "length": "all", **mcnemar_exact(all_a, all_b)})
    return rows
