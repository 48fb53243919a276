"""The ``perplexity`` section's paired comparison: the perplexity ratio against the reference on the same documents.

Documents differ from one another far more than models do, so two per-model intervals overlap even when one
model is better on nearly every document; compared on the same documents (resampled jointly for both models),
the differences that are real show up. Rows (``comparisons.perplexity`` of the report)::

    {model, view: "length" | "bucket", length | start/end, ratio, ci_low, ci_high, p_value, p_holm, documents}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxext.scoring.stats import EXACT_UNITS, paired_ppl_ratio


def _pair(a: dict[str, Any], a_keys: list[str], b: dict[str, Any], b_keys: list[str]) -> list[tuple[int, int]]:
    # Positions (in a's and b's per-document lists) of the documents both scored, matched by content.
    b_pos = {b_keys[d]: i for i, d in enumerate(b["docs"])}
    return [(i, b_pos[a_keys[d]]) for i, d in enumerate(a["docs"]) if a_keys[d] in b_pos]


def _protocol(mode: str | None) -> str | None:
    # One-pass and per-length scoring compute the same truncated-document NLLs (one pass serves every
    # length for static RoPE; length-dependent RoPE needs a pass per length); sliding windows differ.
    return "truncated" if mode in ("one-pass", "per-length") else mode


def ratio_rows(
    m: dict[str, Any], ref: dict[str, Any], resamples: int, seed: int, notes: list[str]
) -> list[dict[str, Any]]:
    """``ppl(model) / ppl(reference)`` per length and per position bucket, on the documents both scored.

    Documents are matched by a hash of their tokens (models with different tokenizers are not paired, and a
    note says so); the ratio has a 95 % paired bootstrap interval and a two-sided p-value
    (:func:`~ctxext.scoring.stats.paired_ppl_ratio`).
    """
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


def ratio_markdown(rows: list[dict[str, Any]], reference: str) -> list[str]:
    """The ratios ppl(model) / ppl(reference) by length, then by token position."""
    from ctxext.artifacts.tables import p_text, table

    lines: list[str] = []
    by_len = [r for r in rows if r["view"] == "length"]
    if by_len:
        lines += [
            "### Perplexity ratio by length",
            "",
            f"ppl(model) / ppl({reference}) on the same tokens of the same documents, with a 95 % paired bootstrap "
            "interval (documents resampled jointly); ** the interval excludes 1. p: of a ratio of 1, the exact "
            f"sign-flip test over the documents up to {EXACT_UNITS} of them (no p below 2 / 2^docs), the bootstrap's "
            "beyond.",
            "",
        ]
        cells = [
            [
                r["model"],
                str(r["length"]),
                _ratio_cell(r),
                str(r["documents"]),
                p_text(r["p_value"]),
                p_text(r["p_holm"]),
            ]
            for r in by_len
        ]
        lines += table(["model", "length", "ratio [95 % CI]", "docs", "p", "p Holm"], cells)
    by_bucket = [r for r in rows if r["view"] == "bucket"]
    if by_bucket:
        models = list(dict.fromkeys(r["model"] for r in by_bucket))
        edges = list(dict.fromkeys((r["start"], r["end"]) for r in by_bucket))
        lines += [
            "### Perplexity ratio by token position",
            "",
            f"ppl(model) / ppl({reference}) per position bucket.",
            "",
        ]
        grid: list[list[str]] = []
        for start, end in edges:
            row = [f"{start}–{end}"]
            for name in models:
                r = next((x for x in by_bucket if x["model"] == name and x["start"] == start), None)
                row.append("–" if r is None else _ratio_cell(r))
            grid.append(row)
        lines += table(["positions"] + models, grid)
    return lines


def ratio_summary(rows: list[dict[str, Any]], reference: str) -> list[str]:
    """Console lines: the ratio at each length, per model."""
    return [
        f"paired — {r['model']} / {reference} ppl@{r['length']}: {r['ratio']:.3f}× [{r['ci_low']:.3f}, "
        f"{r['ci_high']:.3f}] over {r['documents']} documents, p Holm {r['p_holm']:.2g}"
        for r in rows
        if r["view"] == "length"
    ]


def _ratio_cell(r: dict[str, Any]) -> str:
    import math

    from ctxext.artifacts.tables import num_text

    low, high = r.get("ci_low"), r.get("ci_high")
    if low is None or high is None or not math.isfinite(low):
        return f"{num_text(r['ratio'], '.3f')}× [–]"
    mark = "" if low <= 1 <= high else " **"
    return f"{num_text(r['ratio'], '.3f')}× [{low:.3f}, {high:.3f}]{mark}"
