"""The ``attention`` section's part of ``report.md`` and of the model card, its plot, paired rows and console lines.

Every function reads the report's JSON form (model entries holding an ``attention`` part, its schema
:class:`~ctxext.evaluation.sections.attention.schema.Attention`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def attention_markdown(models: list[dict[str, Any]]) -> list[str]:
    """The attention-diagnostics section: per model and layer, mass by distance band, beyond the window, sinks.

    Args:
        models: model entries with an ``attention`` section.

    Returns:
        Markdown lines.
    """
    from ctxext.artifacts.tables import num_text, table

    first = models[0]["attention"]
    lines = [
        "## Attention diagnostics",
        "",
        f"Per layer, averaged over heads and {first['documents']} documents of {first['length']} tokens: the share "
        "of attention mass by query–key distance (as a fraction of the length), on keys beyond the model's "
        f"original window, and on the first {first['settings']['sink_tokens']} tokens (sinks), for queries in the "
        "second half of the sequence; entropy (nats) over all queries. Recomputed from each layer's q and k "
        "with the model's own rotary embedding.",
        "",
    ]
    labels = first["band_labels"]
    rows = []
    for m in models:
        a = m["attention"]
        mark = " †" if a.get("beyond_context") else ""
        for lay in [*a["layers"], {"layer": "mean", **a["mean"]}]:
            rows.append(
                [
                    f"{m['name']}{mark}",
                    str(lay["layer"]),
                    *[num_text(x, ".1f", 100) for x in lay["bands"]],
                    f"{num_text(lay['beyond_original'], '.1f', 100)} (> {a['original_length']})",
                    num_text(lay["sinks"], ".1f", 100),
                    f"{lay['entropy']:.2f}",
                ]
            )
    lines += table(["model", "layer", *[f"d {x} of L" for x in labels], "beyond window %", "sinks %", "entropy"], rows)
    return lines


def attention_plot(plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
    """``attention.png``: mass beyond the original window per layer, and entropy by query position.

    Args:
        plt: ``matplotlib.pyplot``.
        models: report model entries (those without ``attention`` are skipped).
        folder: where to write.

    Returns:
        ``{"attention_diagnostics": file name}``, or empty without attention sections.
    """
    from ctxext.artifacts.figures import save_figure

    have = [m for m in models if m.get("attention")]
    if not have:
        return {}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    width = 0.8 / len(have)
    for i, m in enumerate(have):
        a = m["attention"]
        layers = [lay["layer"] for lay in a["layers"]]
        axes[0].bar(
            [x + i * width for x in layers],
            [lay["beyond_original"] * 100 for lay in a["layers"]],
            width=width,
            label=m["name"],
        )
        bottom = 0.0
        for b, (label, share) in enumerate(zip(a["band_labels"], a["mean"]["bands"], strict=True)):
            axes[1].bar(
                i,
                share * 100,
                bottom=bottom,
                color=plt.cm.viridis(b / max(1, len(a["band_labels"]) - 1)),
                label=label if i == 0 else None,
            )
            bottom += share * 100
        centres = [(s + e) / 2 for s, e in a["position_buckets"]]
        mean_ent = [
            sum(col) / len(col) for col in zip(*[lay["entropy_by_position"] for lay in a["layers"]], strict=True)
        ]
        axes[2].plot(centres, mean_ent, marker="o", label=m["name"])
    n_layers = max(len(m["attention"]["layers"]) for m in have)
    axes[0].set_xticks([x + 0.4 - width / 2 for x in range(n_layers)], [str(x) for x in range(n_layers)])
    axes[0].set_xlabel("layer")
    axes[0].set_ylabel("% of attention mass")
    axes[0].set_title(f"Beyond the original window ({have[0]['attention']['original_length']} tokens)")
    axes[0].legend()
    axes[1].set_xticks(range(len(have)), [m["name"] for m in have])
    axes[1].set_ylabel("% of attention mass (mean over layers)")
    axes[1].set_title("By query–key distance (share of length)")
    axes[1].legend(fontsize=8)
    axes[2].set_xlabel("query position (bucket centre)")
    axes[2].set_ylabel("entropy (nats, mean over layers)")
    axes[2].set_title("Attention entropy by position")
    axes[2].legend()
    return {"attention_diagnostics": save_figure(fig, folder, "attention.png")}


def attention_rows(m: dict[str, Any], ref: dict[str, Any], resamples: int, seed: int) -> list[dict[str, Any]]:
    """The share of attention beyond the original window, model − reference, paired bootstrap over documents."""
    import numpy as np

    from ctxext.scoring.stats import paired_mean_difference

    a, b = m.get("attention") or {}, ref.get("attention") or {}
    da, db = a.get("per_document"), b.get("per_document")
    if not da or not db or a.get("length") != b.get("length"):
        return []
    b_pos = {k: i for i, k in enumerate(db["keys"])}
    pairs = [(i, b_pos[k]) for i, k in enumerate(da["keys"]) if k in b_pos]
    if not pairs:
        return []
    xa = np.array([da["beyond_original"][i] for i, _ in pairs])
    xb = np.array([db["beyond_original"][j] for _, j in pairs])
    return [{"model": m["name"], "length": a["length"], **paired_mean_difference(xa, xb, resamples, seed)}]


def attention_paired_markdown(rows: list[dict[str, Any]], reference: str) -> list[str]:
    """One table: Δ share beyond the window [95 % CI] per model."""
    from ctxext.artifacts.tables import num_text, p_text, table

    lines = [
        "### Attention beyond the original window, paired documents",
        "",
        f"Share of attention on keys beyond the original window (mean over layers), model − {reference}, in "
        "percentage points [95 % paired bootstrap CI over documents].",
        "",
    ]
    cells = [
        [
            r["model"],
            str(r["length"]),
            f"{num_text(r['difference'], '+.1f', 100)} [{num_text(r['ci_low'], '+.1f', 100)}, "
            f"{num_text(r['ci_high'], '+.1f', 100)}]",
            str(r["documents"]),
            p_text(r["p_value"]),
            p_text(r["p_holm"]),
        ]
        for r in rows
    ]
    lines += table(["model", "length", "Δ share (pts)", "docs", "p", "p Holm"], cells)
    return lines


def attention_paired_summary(rows: list[dict[str, Any]], reference: str) -> list[str]:
    """Console lines: the difference in the share beyond the original window, per model."""
    from ctxext.artifacts.tables import num_text

    return [
        f"paired — {r['model']} − {reference} attention beyond the original window at {r['length']}: "
        f"{num_text(r['difference'], '+.1f', 100)} pts [{num_text(r['ci_low'], '+.1f', 100)}, "
        f"{num_text(r['ci_high'], '+.1f', 100)}] over {r['documents']} documents"
        for r in rows
    ]


def attention_card_rows(models: list[dict[str, Any]]) -> list[str]:
    """One row per model: the layer means (the report has the per-layer table)."""
    from ctxext.artifacts.tables import num_text, table

    rows = [
        [
            m["name"] + (" †" if m["attention"].get("beyond_context") else ""),
            str(m["attention"]["length"]),
            num_text(m["attention"]["mean"]["beyond_original"], ".1f", 100),
            num_text(m["attention"]["mean"]["sinks"], ".1f", 100),
            num_text(m["attention"]["mean"]["entropy"], ".2f"),
        ]
        for m in models
    ]
    header = ["model", "length", "beyond original window %", "sinks %", "entropy (nats)"]
    return ["Attention (means over layers):", "", *table(header, rows)]


def attention_summary(entry: dict[str, Any]) -> str:
    """Means over layers: beyond the original window, on sinks, entropy."""
    a = entry["attention"]
    return (
        f"at {a['length']} tokens: mass beyond the original window ({a['original_length']}) "
        f"{a['mean']['beyond_original'] * 100:.1f} %, on the first {a['settings']['sink_tokens']} tokens "
        f"{a['mean']['sinks'] * 100:.1f} %, entropy {a['mean']['entropy']:.2f} nats (means over layers)"
    )
