"""The ``longppl:`` suite section: perplexity on the key tokens one evaluator model picks (:mod:`..longppl`).

The key tokens are chosen once per run, by the evaluator, and every model is scored on them; the evaluator
may be any model of the run, so the section keeps each model's scores from :meth:`begin` to :meth:`finish`
and fills every model's entry at the end.
"""

from __future__ import annotations

from typing import Any

from ctxext.evaluation.longppl import LongPPLRun, LongPPLSettings, model_result, resolve_run, score_model
from ctxext.evaluation.sections import SuiteRun, SuiteSection, register_section


@register_section
class LongPPLSection(SuiteSection):
    """LongPPL and plain perplexity on the same documents, per model and length, with the key-token count."""

    name = "longppl"
    title = "LongPPL: perplexity on the tokens that need the far context"
    settings = LongPPLSettings
    order = 70
    data_keys = ("data",)

    def __init__(self) -> None:
        self._run: LongPPLRun | None = None
        self._last: str | None = None

    def begin(self, settings: Any, run: SuiteRun) -> None:
        """Check the evaluator label and the short context against the run; start a fresh selection."""
        self._run = resolve_run(settings, run.models, run.original, run.context)
        self._last = run.models[-1]

    def describe_data(self, settings: Any) -> dict[str, Any] | None:
        """The documents' source (:func:`ctxext.scoring.texts.describe_source`)."""
        from ctxext.scoring.texts import describe_source

        return describe_source(settings.data, settings.text_field, settings.split)

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """Score one model (its LongPPL is filled in by :meth:`finish`, once the evaluator has run)."""
        from ctxext.evaluation.perplexity import check_lengths

        if self._run is None:
            raise RuntimeError("the longppl section runs inside ctxext.evaluation.suite.run_suite (begin, run, finish)")
        check_lengths(loaded, lengths, beyond_context_ok)
        if self._run.evaluator is None and loaded.name == self._last:
            # The reference model is matched by its configured context; should no model match (a config read
            # differently at load), the last model evaluates rather than none.
            self._run.evaluator = loaded.name
        score_model(loaded, settings, self._run, lengths, show)
        return {"evaluator": self._run.evaluator, "note": "scored; completed when every model has run"}

    def finish(self, settings: Any, entries: list[dict[str, Any]]) -> None:
        """Every model's LongPPL on the evaluator's key tokens."""
        run, self._run = self._run, None
        if run is None:
            return
        for entry in entries:
            if entry["name"] in run.models:
                entry[self.name] = model_result(entry["name"], settings, run)

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """One table: LongPPL, perplexity and key tokens per length and model, with the paired ratio."""
        return longppl_markdown(models, report)


def longppl_markdown(models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
    """``report.md`` lines of the ``longppl`` section (paired ratios against the report's reference model)."""
    from ctxext.artifacts.tables import fmt, table

    first = models[0]["longppl"]
    st = first.get("settings") or {}
    ref_name = (report.get("comparisons") or {}).get("reference") or models[0]["name"]
    ref = next((m for m in models if m["name"] == ref_name), None)
    lines = [f"## {LongPPLSection.title}", ""]
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
