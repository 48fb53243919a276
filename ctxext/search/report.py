"""The searched factors against the named methods on held-out files: perplexity, retrieval, paired statistics.

Every variant (the unpatched base, the searched factors, PI / NTK / YaRN / llama3 at their defaults) is
applied to the same loaded model and scored on the same held-out items, so every comparison is paired:

* perplexity at the target length by position bucket, and inside the original window (first ``L``
  tokens of the same documents);
* teacher-forced needle retrieval by depth at the target and inside the original window, and
  multi-key retrieval (three distractor keys) at the target;
* the search's own objective on held-out files (needle answer NLL or far-position NLL).

"Best named method" is the named method with the lowest held-out objective; the searched factors are
compared with it by a paired bootstrap over items (documents or trials) of the difference of means
(:func:`ctxext.scoring.stats.bootstrap_mean_diff`): the objective in NLL per token, retrieval in
accuracy points.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ctxext.scoring.texts import HELDOUT
from ctxext.search.objective import ItemScores, ObjectiveSet, build_objective, retrieval_set

REPORT_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
N_BUCKETS = 8


def check_fitness_data(data: str) -> None:
    """Refuse fitness data that shares files with the held-out set (:func:`~ctxext.scoring.texts.refuse_heldout`).

    Raises:
        InputError: ``data`` reads some of :data:`HELDOUT`'s files.
    """
    from ctxext.scoring.texts import refuse_heldout

    refuse_heldout(
        data,
        "--data / search.data",
        "the factors the report compares",
        "use builtin:stdlib-train (the default) or your own files, or turn the report off (--no-report)",
    )


def _ppl(sums: np.ndarray, counts: np.ndarray) -> dict[str, Any]:
    from ctxext.scoring.stats import ppl_entry

    return ppl_entry(sums, counts)


def _accuracy(scores: ItemScores, depths: list[float | None]) -> dict[str, Any]:
    from ctxext.scoring.stats import wilson_interval

    correct = scores.correct if scores.correct is not None else np.zeros(0, dtype=bool)
    by_depth: dict[str, Any] = {}
    for depth in sorted({d for d in depths if d is not None}):
        hits = [bool(c) for c, d in zip(correct, depths, strict=True) if d == depth]
        low, high = wilson_interval(sum(hits), len(hits))
        by_depth[f"{depth:g}"] = {
            "accuracy": sum(hits) / len(hits),
            "trials": len(hits),
            "ci_low": low,
            "ci_high": high,
        }
    low, high = wilson_interval(int(correct.sum()), len(correct))
    return {
        "accuracy": float(correct.mean()) if len(correct) else math.nan,
        "trials": int(len(correct)),
        "ci_low": low,
        "ci_high": high,
        "min_depth_accuracy": min((v["accuracy"] for v in by_depth.values()), default=math.nan),
        "by_depth": by_depth,
    }


def _paired(a: np.ndarray, b: np.ndarray, counts: np.ndarray) -> dict[str, Any]:
    from ctxext.scoring.stats import bootstrap_mean_diff

    diff = float((a.sum() - b.sum()) / counts.sum())
    low, high = bootstrap_mean_diff(a, b, counts)
    return {
        "diff": diff,
        "ci_low": low,
        "ci_high": high,
        "excludes_zero": bool(low > 0 or high < 0),
        "items": int(len(a)),
    }


def compare_heldout(
    switch: Any,
    tokenizer: Any,
    long_factor: np.ndarray,
    target_length: int,
    *,
    objective: str = "needle",
    trials: int = 20,
    docs: int = 24,
    seed: int = 0,
    attention_factor: float = 1.0,
    window_docs: int = 256,
    show_progress: bool = False,
    templates: list[int] | None = None,
) -> dict[str, Any]:
    """Score the base, the searched factors and the named methods on held-out files.

    Args:
        switch: a :class:`~ctxext.search.apply.RopeSwitch` around the loaded model.
        tokenizer: its tokenizer.
        long_factor: the searched factors.
        target_length: the target length.
        objective: the search objective (its held-out value decides the best named method).
        trials: retrieval trials per depth.
        docs: held-out documents for perplexity.
        seed: seeds the held-out samples (the search passes none: every search, whatever its own seed, is
            compared on the same held-out items).
        attention_factor: the searched model's attention factor.
        window_docs: held-out windows of ``L`` tokens for the in-window statistics.
        show_progress: print nothing extra (kept for symmetry; scoring is fast).
        templates: the needle forms of the held-out objective (the search's: the forms the base retrieves
            inside its window); default the task's training templates.

    Returns:
        The JSON-ready comparison.
    """
    from ctxext.scoring.texts import leading_tokens
    from ctxext.scoring.windows import windows
    from ctxext.search.apply import longrope_options
    from ctxext.search.factors import NAMED_METHODS, method_factors

    switch.restore()
    original = switch.state.original_length
    named = {
        m: method_factors(switch.model.config, m, target_length, None, switch.original_length) for m in NAMED_METHODS
    }
    texts = {
        "ppl": leading_tokens(tokenizer, HELDOUT, target_length, docs),
        "window": windows(tokenizer, HELDOUT, original, window_docs),
    }
    sets = _heldout_sets(tokenizer, objective, target_length, original, trials, seed, templates)
    variants: list[tuple[str, str | None, dict[str, Any] | None]] = [
        ("base", None, None),
        ("searched", "longrope", longrope_options(long_factor, attention_factor)),
        *[(m, m, None) for m in NAMED_METHODS],
    ]
    raw = {name: _score_variant(switch, method, opts, target_length, texts, sets) for name, method, opts in variants}
    switch.restore()

    models = {name: _summarise(r, raw["base"], sets, target_length) for name, r in raw.items()}
    models["searched"]["factors"] = [float(v) for v in long_factor]
    for m in NAMED_METHODS:
        models[m]["factors"] = [float(v) for v in named[m]]
    best_named = min(NAMED_METHODS, key=lambda m: models[m]["objective_nll"])
    window = models["searched"]["window_vs_base"]
    return {
        "target_length": target_length,
        "original_length": original,
        "heldout": HELDOUT,
        "sets": {k: v.info for k, v in sets.items()}
        | {"ppl_documents": len(texts["ppl"]), "window_documents": len(texts["window"])},
        "models": models,
        "comparison": _comparison(raw, models, best_named, objective),
        "in_window_max_abs_nll_diff_vs_base": window["max_abs_nll_diff"],
        "attention_factor": attention_factor,
    }


def _heldout_sets(
    tokenizer: Any,
    objective: str,
    target_length: int,
    original: int,
    trials: int,
    seed: int,
    templates: list[int] | None = None,
) -> dict[str, ObjectiveSet]:
    """The held-out retrieval sets (and the objective's own set), the same items for every variant."""
    return {
        "objective": build_objective(
            objective, tokenizer, target_length, original, 8 * trials, seed + 1, HELDOUT, templates=templates
        ),
        "needle": retrieval_set(tokenizer, HELDOUT, target_length, REPORT_DEPTHS, trials, seed, "needle", [0]),
        "needle_in_window": retrieval_set(tokenizer, HELDOUT, original, REPORT_DEPTHS, trials, seed, "needle", [0]),
        "multikey": retrieval_set(tokenizer, HELDOUT, target_length, REPORT_DEPTHS, trials, seed, "multikey", [0]),
    }


def _score_variant(
    switch: Any,
    method: str | None,
    options: dict[str, Any] | None,
    target_length: int,
    texts: dict[str, list[list[int]]],
    sets: dict[str, ObjectiveSet],
) -> dict[str, Any]:
    """Apply one variant (None: the base) and score every held-out item with it."""
    from ctxext.scoring.windows import doc_nll

    if method is None:
        switch.restore()
    else:
        switch.use(method, target_length, options)
    model = switch.model
    nll = doc_nll(model, texts["ppl"]) if texts["ppl"] else np.zeros((0, target_length - 1))
    nll_window = doc_nll(model, texts["window"])
    return {"nll": nll, "nll_window": nll_window, **{k: s.score(model) for k, s in sets.items()}}


def _summarise(
    r: dict[str, Any], base: dict[str, Any], sets: dict[str, ObjectiveSet], target_length: int
) -> dict[str, Any]:
    """One variant's report entry: perplexities (by bucket, in-window paired with the base) and retrieval."""
    from ctxext.scoring.windows import paired_window_ratio

    n_docs = r["nll"].shape[0]
    bucket = target_length // N_BUCKETS
    buckets = []
    for b in range(N_BUCKETS):
        # Column t − 1 holds token t; bucket b holds the tokens at positions [b·w, (b+1)·w).
        lo, hi = max(1, b * bucket), (b + 1) * bucket
        cols = r["nll"][:, lo - 1 : hi - 1]
        entry = _ppl(cols.sum(axis=1), np.full(n_docs, cols.shape[1], dtype=np.float64))
        buckets.append({"start": b * bucket, "end": (b + 1) * bucket, **entry})
    window = r["nll_window"]
    in_window_hits = r["needle_in_window"].correct.astype(np.float64)
    base_hits = base["needle_in_window"].correct.astype(np.float64)
    return {
        "ppl_target": _ppl(r["nll"].sum(axis=1), np.full(n_docs, r["nll"].shape[1], dtype=np.float64)),
        "ppl_window": _ppl(window.sum(axis=1), np.full(len(window), window.shape[1], dtype=np.float64)),
        "window_vs_base": paired_window_ratio(window, base["nll_window"]),
        "needle_in_window_vs_base": _paired(in_window_hits, base_hits, np.ones(len(base_hits))),
        "ppl_buckets": buckets,
        "objective_nll": r["objective"].mean_nll,
        "objective_fitness": sets["objective"].fitness(r["objective"]),
        "needle": _accuracy(r["needle"], sets["needle"].depths),
        "needle_in_window": _accuracy(r["needle_in_window"], sets["needle_in_window"].depths),
        "multikey": _accuracy(r["multikey"], sets["multikey"].depths),
    }


def _comparison(
    raw: dict[str, dict[str, Any]], models: dict[str, Any], best_named: str, objective: str
) -> dict[str, Any]:
    """Searched − best named method: the held-out objective and retrieval, paired over items."""
    s, b = raw["searched"], raw[best_named]
    out = {
        "best_named": best_named,
        "objective": {
            "kind": objective,
            "searched_nll": models["searched"]["objective_nll"],
            "best_named_nll": models[best_named]["objective_nll"],
            "ratio": math.exp(models["searched"]["objective_nll"] - models[best_named]["objective_nll"]),
            **_paired(s["objective"].nll_sums, b["objective"].nll_sums, s["objective"].counts),
        },
    }
    for task in ("needle", "multikey"):
        hits_s, hits_b = s[task].correct.astype(np.float64), b[task].correct.astype(np.float64)
        out[task] = _paired(hits_s, hits_b, np.ones(len(hits_s)))
    return out


def _pct(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def render_markdown(report: dict[str, Any], summary: dict[str, Any]) -> str:
    """The report as Markdown (tables of the JSON report)."""
    models = report["models"]
    L, T = report["original_length"], report["target_length"]
    cmp_ = report["comparison"]
    obj = cmp_["objective"]
    lines = [
        f"# RoPE factor search: {summary['settings']['model']} → {T} tokens",
        "",
        f"Search: objective `{summary['settings']['objective']}` on training-split data, "
        f"{summary['evaluations']} candidates evaluated, ended by {summary['ended']} after "
        f"{summary['seconds']:.0f} s wall / {summary['cpu_seconds']:.0f} s CPU; training objective "
        f"{summary['score']:.4f} (best seed {summary['best_seed']['name']}: {summary['best_seed']['score']:.4f}).",
        "",
        f"Held-out ({report['heldout']}): best named method by the held-out objective: **{cmp_['best_named']}**. "
        f"Searched − {cmp_['best_named']}: {obj['diff']:+.4f} NLL/token (paired 95% CI {obj['ci_low']:+.4f} … "
        f"{obj['ci_high']:+.4f}, {obj['items']} items; ratio of perplexities {obj['ratio']:.3f})"
        + (" — the CI excludes 0." if obj["excludes_zero"] else " — the CI includes 0 (no significant difference).")
        + (
            " The held-out objective compared here is the mean answer NLL of all needles (the worst-depth value "
            "the search minimised is `objective_fitness` in report.json)."
            if obj["kind"] == "needle-worst"
            else ""
        ),
        "",
        f"| variant | held-out objective (NLL/token) | ppl@{L} | ppl@{T} | needle@{L} | needle@{T} "
        f"| worst depth@{T} | multikey@{T} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in models.items():
        lines.append(
            f"| {name} | {m['objective_nll']:.4f} | {m['ppl_window']['ppl']:.2f} | {m['ppl_target']['ppl']:.2f} | "
            f"{_pct(m['needle_in_window']['accuracy'])} | {_pct(m['needle']['accuracy'])} | "
            f"{_pct(m['needle']['min_depth_accuracy'])} | {_pct(m['multikey']['accuracy'])} |"
        )
    depths = list(next(iter(models.values()))["needle"]["by_depth"])
    lines += ["", f"Needle retrieval at {T} tokens by depth (teacher-forced):", ""]
    lines += ["| variant | " + " | ".join(depths) + " |", "|---|" + "---|" * len(depths)]
    for name, m in models.items():
        lines.append(f"| {name} | " + " | ".join(_pct(m["needle"]["by_depth"][d]["accuracy"]) for d in depths) + " |")
    buckets = next(iter(models.values()))["ppl_buckets"]
    lines += ["", f"Perplexity by position at {T} tokens ({report['sets']['ppl_documents']} held-out documents):", ""]
    lines += [
        "| variant | " + " | ".join(f"{b['start']}–{b['end']}" for b in buckets) + " |",
        "|---|" + "---|" * len(buckets),
    ]
    for name, m in models.items():
        lines.append(f"| {name} | " + " | ".join(f"{b['ppl']:.2f}" for b in m["ppl_buckets"]) + " |")
    lines += ["", f"Paired differences, searched − {cmp_['best_named']} (bootstrap over trials, 95% CI):", ""]
    for task in ("needle", "multikey"):
        c = cmp_[task]
        lines.append(
            f"- {task}@{T}: {100 * c['diff']:+.1f} points "
            f"({100 * c['ci_low']:+.1f} … {100 * c['ci_high']:+.1f}, {c['items']} trials)"
        )
    lines.append(_window_line(report))
    lines += ["", "![factors](factors.png)", ""]
    return "\n".join(lines)


def window_verdict(window: dict[str, Any]) -> str:
    """``identical``, ``not detectably changed`` (paired CI includes 1) or ``changed``."""
    if window["max_abs_nll_diff"] == 0.0:
        return "identical"
    return "not detectably changed" if window["includes_one"] else "changed"


def _window_line(report: dict[str, Any]) -> str:
    # The in-window cost of the searched model, paired with the base (same windows, same trials).
    s = report["models"]["searched"]
    w, n = s["window_vs_base"], s["needle_in_window_vs_base"]
    return (
        f"- inside the original window ({report['original_length']} tokens; short factors 1, attention factor "
        f"{report.get('attention_factor', 1.0):.4g}): ppl ratio vs the base {w['ratio']:.4f} (paired 95% CI "
        f"{w['ci_low']:.4f} … {w['ci_high']:.4f}, {w['documents']} held-out windows; max |ΔNLL| "
        f"{w['max_abs_nll_diff']:.1e}) — {window_verdict(w)}; needle@{report['original_length']} vs the base "
        f"{100 * n['diff']:+.1f} points ({100 * n['ci_low']:+.1f} … {100 * n['ci_high']:+.1f})"
    )


def plot_factors(report: dict[str, Any], path: Path) -> None:
    """Factor vs dimension: the searched factors against PI / NTK / YaRN / llama3."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, m in report["models"].items():
        if "factors" not in m:
            continue
        style: dict[str, Any] = {"linewidth": 1.2, "linestyle": "--"}
        if name == "searched":
            style = {"linewidth": 2.5, "color": "black"}
        ax.plot(range(len(m["factors"])), m["factors"], label=name, **style)
    ax.set_yscale("log")
    ax.set_xlabel("rotary dimension pair i (0 = highest frequency)")
    ax.set_ylabel("rescale factor λ_i (inv_freq ÷ λ_i)")
    ax.set_title(f"long factors, {report['original_length']} → {report['target_length']} tokens")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: dict[str, Any], folder: Path, summary: dict[str, Any]) -> None:
    """Write ``report.json``, ``report.md`` and ``factors.png`` into ``folder``."""
    folder = Path(folder)
    (folder / "report.json").write_text(json.dumps(report, indent=2, default=float) + "\n")
    (folder / "report.md").write_text(render_markdown(report, summary) + "\n")
    plot_factors(report, folder / "factors.png")
