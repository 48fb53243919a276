"""The ``qa:`` suite section: long-document QA, SQuAD exact match / F1 by answer position and context length.

The section's settings are :class:`~ctxext.evaluation.settings.QASettings` (the flags of ``ctxext eval qa``
are generated from them); the answers are greedy (:mod:`ctxext.evaluation.qa`). It takes no suite length:
``max_length`` resolves against each model's contexts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxext.evaluation.sections import SuiteSection, register_section
from ctxext.evaluation.settings import Length, QASettings


@register_section
class QASection(SuiteSection):
    """Long-document QA: greedy answers, SQuAD EM / F1 by answer position and context length.

    A suite holding only a qa: section (ctxext eval run), its keys as flags with the same defaults.
    """

    name = "qa"
    title = "Long-document QA"
    settings = QASettings
    order = 40
    data_keys = ("data", "chat_template")

    def lengths(self, settings: Any) -> list[Length]:
        """None: ``max_length`` resolves against each model's contexts."""
        return []

    def describe_data(self, settings: Any) -> dict[str, Any] | None:
        """The QA data set."""
        from ctxext.scoring.texts import describe_source

        return describe_source(settings.data, split=settings.split)

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """EM / F1 of one model (:func:`ctxext.evaluation.qa.evaluate_qa`)."""
        from ctxext.evaluation.qa import evaluate_qa

        return evaluate_qa(loaded, settings, show)

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """EM / F1 per model, overall and by bucket."""
        return ["## Long-document QA", "", *_qa_table(models)]

    def card_rows(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """The report's table."""
        return ["Long-document QA (exact match / F1, %):", "", *_qa_table(models)]

    def plots(self, plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
        """``qa_by_bucket.png``: F1 by answer position and by context length."""
        from ctxext.artifacts.figures import save_figure

        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, key, title in ((axes[0], "by_position", "answer position"), (axes[1], "by_length", "context length")):
            labels: list[str] = []
            for m in models:
                labels += [b for b in m["qa"][key] if b not in labels]
            width = 0.8 / len(models)
            for i, m in enumerate(models):
                vals = [(m["qa"][key].get(b) or {}).get("f1") or 0.0 for b in labels]
                ax.bar([j + i * width for j in range(len(labels))], vals, width=width, label=m["name"])
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels, rotation=30)
            ax.set_ylim(0, 100)
            ax.set_ylabel("F1 (%)")
            ax.set_title(f"QA F1 by {title}")
        axes[0].legend()
        return {"qa_by_bucket": save_figure(fig, folder, "qa_by_bucket.png")}

    def summary(self, entry: dict[str, Any]) -> str | None:
        """EM and F1 overall."""
        q = entry["qa"]["overall"]
        return (
            f"EM {q['exact_match']:.1f}, F1 {q['f1']:.1f} over {q['examples']} examples "
            f"({entry['qa']['truncated']} truncated in the middle)"
        )


def _qa_table(models: list[dict[str, Any]]) -> list[str]:
    # The table report.md and the card share (ctxext.artifacts.tables), from the typed entries.
    from ctxext.artifacts.report import ModelEntry
    from ctxext.artifacts.tables import qa_table

    return qa_table([ModelEntry.model_validate(m) for m in models])
