"""The ``longppl`` section's part of ``report.md``: LongPPL and perplexity per length and model, paired ratios."""

from __future__ import annotations

from typing import Any


def longppl_markdown(models: list[dict[str, Any]], report: dict[str, Any], title: str) -> list[str]:
    """``report.md`` lines of the ``longppl`` section (paired ratios against the report's reference model).

    The ratio's reference is the report's, unless that model is the named evaluator (selection-biased: it chose
    the tokens): then the first other model.
    """
    from ctxext.artifacts.tables import fmt, table

    first = models[0]["longppl"]
    st = first.get("settings") or {}
    evaluator = first.get("evaluator")
    ref_name = (report.get("comparisons") or {}).get("reference") or models[0]["name"]
    if ref_name == evaluator:
        ref_name = next((m["name"] for m in models if m["name"] != evaluator), ref_name)
    ref = next((m for m in models if m["name"] == ref_name), None)
    if evaluator:
        who = (
            f"Key tokens chosen by the evaluator **{evaluator}** alone; it is scored on its own picks (selection-"
            "biased low), so it is shown but not compared"
        )
    else:
        who = (
            "Key tokens: the union of every model's own ("
            + ", ".join(f"**{n}**" for n in first.get("selectors") or [])
            + "), so the set does not depend on the models' order and no model is scored only on its own picks"
        )
    lines = [f"## {title}", ""]
    lines += [
        f"{who}. A model's own key tokens: log-prob gain of the full context over a {st.get('short_context')}-token "
        f"context (windows of {st.get('short_context')} + {st.get('stride')} tokens) above {st.get('lsd_threshold')}"
        f" nats, and long-context log-prob above {st.get('lcl_threshold')} (Fang et al. 2024). Every model is scored "
        "on the same tokens of the same documents; perplexity is over all their tokens. LongPPL and perplexity: "
        "per-document values averaged with key-token / token weights (the reference code's aggregation) [95 % CI] "
        "(documents; for LongPPL those holding key tokens); pooled: exp of the mean NLL over all those tokens. Lower "
        f"is better; † beyond the model's context; ratio: of the LongPPLs, paired bootstrap against {ref_name}.",
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
            pooled = f"{_value(e.get('longppl_pooled'))} / {_value(e.get('ppl_pooled'))}"
            ratio = "(evaluator: not compared)" if m["name"] == evaluator else _ratio(m, ref, L)
            rows.append([str(L), m["name"], _ppl(e["longppl"]) + mark, _ppl(e["ppl"]) + mark, pooled, key, ratio])
    header = ["length", "model", "LongPPL [95 % CI]", "perplexity [95 % CI]", "pooled LongPPL / ppl", "key tokens"]
    lines += table([*header, "LongPPL ratio"], rows)
    notes = [f"- {m['name']}: {m['longppl']['note']}" for m in models if not m["longppl"].get("by_length")]
    return lines + (notes + [""] if notes else [])


def _value(e: dict[str, Any] | None) -> str:
    from ctxext.artifacts.tables import fmt

    return "–" if not e or e.get("ppl") is None else fmt(e["ppl"])


def _ppl(e: dict[str, Any] | None) -> str:
    from ctxext.artifacts.tables import fmt

    if not e or e.get("ppl") is None:
        return "–"
    return f"{fmt(e['ppl'])} [{fmt(e['ci_low'])}, {fmt(e['ci_high'])}] ({e.get('documents')})"


def _ratio(m: dict[str, Any], ref: dict[str, Any] | None, length: int) -> str:
    # Σ n_d ppl_d(model) / Σ n_d ppl_d(reference) over the same key tokens, documents resampled jointly.
    import numpy as np

    from ctxext.artifacts.tables import fmt
    from ctxext.scoring.stats import paired_doc_ppl_ratio

    if ref is None or m is ref:
        return "(reference)" if m is ref else "–"
    a = (m["longppl"].get("per_document") or {}).get("by_length", {}).get(str(length))
    b = (ref["longppl"].get("per_document") or {}).get("by_length", {}).get(str(length))
    if not a or not b or sum(a["key_tokens"]) == 0:
        return "–"
    st = m["longppl"].get("settings") or {}
    has = np.array(a["key_tokens"]) > 0  # documents without a key token have no LongPPL (see model_result)
    stat = paired_doc_ppl_ratio(
        np.array(a["key_nll_sums"])[has],
        np.array(b["key_nll_sums"])[has],
        np.array(a["key_tokens"])[has],
        int(st.get("resamples", 1000)),
        int(st.get("seed", 0)),
    )
    return f"{fmt(stat['ratio'])} [{fmt(stat['ci_low'])}, {fmt(stat['ci_high'])}], p = {fmt(stat['p_value'], 2)}"
