"""The ``perplexity`` section's plots: by token position, by evaluation length, and the context-use curve."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def perplexity_plots(plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
    """Perplexity by position, by length, and the context-use curve (each when the results have it).

    Args:
        plt: ``matplotlib.pyplot``.
        models: report model entries (JSON form) with a ``perplexity`` part.
        folder: where to write.

    Returns:
        Plot name → file name.
    """
    from ctxext.artifacts.figures import save_figure

    written: dict[str, str] = {}
    ppl = [m for m in models if m.get("perplexity", {}).get("by_bucket")]
    if ppl:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for m in ppl:
            bb = m["perplexity"]["by_bucket"]
            _ppl_with_ci(ax, [(b["start"] + b["end"]) / 2 for b in bb], bb, m["name"])
        for m in ppl:
            ax.axvline(m["rope"]["original_length"], color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("token position (bucket centre)")
        ax.set_ylabel("perplexity")
        ax.set_yscale("log")
        ax.set_title("Perplexity by position (95 % CI; dotted: original context)")
        ax.legend()
        written["perplexity_by_position"] = save_figure(fig, folder, "ppl_by_position.png")

    by_len = [m for m in models if m.get("perplexity", {}).get("by_length")]
    if by_len:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for m in by_len:
            items = sorted(
                ((int(L), e) for L, e in m["perplexity"]["by_length"].items() if e.get("ppl")), key=lambda t: t[0]
            )
            _ppl_with_ci(ax, [L for L, _ in items], [e for _, e in items], m["name"])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel("perplexity")
        ax.set_title("Perplexity by evaluation length (95 % CI)")
        ax.legend()
        written["perplexity_by_length"] = save_figure(fig, folder, "ppl_by_length.png")

    cu = [m for m in models if m.get("perplexity", {}).get("context_use")]
    if cu:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for m in cu:
            c = m["perplexity"]["context_use"]
            lim = c["limits"]
            (line,) = ax.plot([e["context"] for e in lim], [_f(e["ppl"]) for e in lim], marker="o", label=m["name"])
            ax.axhline(_f(c["full"]["ppl"]), color=line.get_color(), linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context limit k (tokens)")
        ax.set_ylabel("perplexity of the same target tokens")
        ax.set_title("Context use (dashed: full context)")
        ax.legend()
        written["perplexity_context_use"] = save_figure(fig, folder, "context_use.png")
    return written


def _f(x: float | None) -> float:
    # The JSON form writes an unmeasured value as null; matplotlib wants NaN (a gap).
    import math

    return math.nan if x is None else x


def _ppl_with_ci(ax: Any, x: list[float], entries: list[dict[str, Any]], label: str) -> None:
    # One model's perplexity curve (entries with ppl / ci_low / ci_high) and its 95 % band.
    ax.plot(x, [_f(e["ppl"]) for e in entries], marker="o", label=label)
    ax.fill_between(x, [_f(e["ci_low"]) for e in entries], [_f(e["ci_high"]) for e in entries], alpha=0.2)
