"""The ``longppl`` section's part of ``report.md``: LongPPL and perplexity per length and model, paired ratios."""

from __future__ import annotations

from typing import Any


def longppl_markdown(models: list[dict[str, Any]], report: dict[str, Any], title: str) -> list[str]:
    """``report.md`` lines of the ``longppl`` section (paired ratios against the report's reference model)."""
    from ctxext.artifacts.tables import fmt, table

    first = models[0]["longppl"]
    st = first.get("settings") or {}
    ref_name = (report.get("comparisons") or {}).get("reference") or models[0]["name"]
    ref = next((m for m in models if m["name"] == ref_name), None)
    lines = [f"## {title}", ""]
    lines += [
        f"Key tokens chosen once by **{first.get('evaluator')}**: log-prob gain of the full context over a "
        f"{st.get('short_context')}-token context (windows of {st.get('short_context')} + {st.get('stride')} "
        f"tokens) above {st.get('lsd_threshold')} nats, and long-context log-prob above {st.get('lcl_threshold')}"
        " (Fang et al. 2024). Every model is scored on those tokens of the same documents; perplexity is over "
        "all their tokens. Cells: ppl [95 % CI] (documents; for LongPPL those holding key tokens). Lower is "
        "better; † beyond the model's context; ratio: paired bootstrap against "
        f"{ref_name}.",
        "",
    ]
    rows = []
    lengths = sorted({int(L) for m in models for L in m["longppl"].get("by_length", {})})
    for L in lengths:
        for m in models:
            e = m["longppl"].get("by_length", {}).get(str(L))
            if not e:
                continue
            mark = " †" if e.get("beyond_context") else ""
            share = e.get("key_fraction")
            key = f"{e['key_tokens']} ({fmt(100 * share, 2)} %)" if share is not None else str(e["key_tokens"])
            rows.append([str(L), m["name"], _ppl(e["longppl"]) + mark, _ppl(e["ppl"]) + mark, key, _ratio(m, ref, L)])
    header = ["length", "model", "LongPPL [95 % CI]", "perplexity [95 % CI]", "key tokens", "LongPPL ratio"]
    lines += table(header, rows)
    notes = [f"- {m['name']}: {m['longppl']['note']}" for m in models if not m["longppl"].get("by_length")]
    return lines + (notes + [""] if notes else [])


def _ppl(e: dict[str, Any] | None) -> str:
    from ctxext.artifacts.tables import fmt

    if not e or e.get("ppl") is None:
        return "–"
    return f"{fmt(e['ppl'])} [{fmt(e['ci_low'])}, {fmt(e['ci_high'])}] ({e.get('documents')})"


def _ratio(m: dict[str, Any], ref: dict[str, Any] | None, length: int) -> str:
    # exp(mean NLL(model) − mean NLL(reference)) over the same key tokens, documents resampled jointly.
    import numpy as np

    from ctxext.artifacts.tables import fmt
    from ctxext.scoring.stats import paired_ppl_ratio

    if ref is None or m is ref:
        return "(reference)" if m is ref else "–"
    a = (m["longppl"].get("per_document") or {}).get("by_length", {}).get(str(length))
    b = (ref["longppl"].get("per_document") or {}).get("by_length", {}).get(str(length))
    if not a or not b or sum(a["key_tokens"]) == 0:
        return "–"
    st = m["longppl"].get("settings") or {}
    has = np.array(a["key_tokens"]) > 0  # documents without a key token carry no evidence (see model_result)
    stat = paired_ppl_ratio(
        np.array(a["key_nll_sums"])[has],
        np.array(b["key_nll_sums"])[has],
        np.array(a["key_tokens"])[has],
        int(st.get("resamples", 1000)),
        int(st.get("seed", 0)),
    )
    return f"{fmt(stat['ratio'])} [{fmt(stat['ci_low'])}, {fmt(stat['ci_high'])}], p = {fmt(stat['p_value'], 2)}"
