"""The ``attention:`` suite section: attention diagnostics per layer, mass by distance band, sinks, entropy.

Its folder: the settings (:mod:`.settings`, the flags of ``ctxext eval attention``), the engine (:mod:`.engine`:
mass by query–key distance band, beyond the model's original window and on the first tokens, and entropy,
recomputed from each layer's q and k), the results' schema (:mod:`.schema`) and ``report.md`` / card / plot /
paired rows (:mod:`.report`). One length per model; paired against the reference model: the share beyond the
original window on the same documents.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxext.evaluation.lengths import Length
from ctxext.evaluation.sections import SuiteSection, register_section
from ctxext.evaluation.sections.attention.schema import Attention
from ctxext.evaluation.sections.attention.settings import AttentionTask


@register_section
class AttentionSection(SuiteSection):
    """Attention diagnostics per layer: mass by distance band, beyond the original window, on sinks; entropy.

    The flags are the keys of a suite's attention: section, generated from their declaration (the same defaults).
    """

    name = "attention"
    title = "Attention diagnostics"
    settings = AttentionTask
    schema = Attention
    order = 50
    data_keys = ("data",)

    def lengths(self, settings: Any) -> list[Length]:
        """The one length of the section."""
        return [settings.length]

    def describe_data(self, settings: Any) -> dict[str, Any] | None:
        """The documents' source."""
        from ctxext.scoring.texts import describe_source

        return describe_source(settings.data, settings.text_field, settings.split)

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """One model's diagnostics at the section's length (:func:`.engine.evaluate_attention`)."""
        from ctxext.evaluation.sections.attention.engine import AttentionSettings, evaluate_attention
        from ctxext.scoring.texts import iter_texts

        beyond = beyond_context_ok or settings.allow_beyond_context
        measured = AttentionSettings.of_section(settings, lengths[0], beyond)
        texts = iter_texts(settings.data, settings.text_field, settings.split)
        return evaluate_attention(loaded, texts, measured, show)

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """Per model and layer: mass by distance band, beyond the window, on sinks; entropy."""
        from ctxext.evaluation.sections.attention.report import attention_markdown

        return attention_markdown(models)

    def plots(self, plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
        """``attention.png``: beyond the window per layer, mass by distance band, entropy by position."""
        from ctxext.evaluation.sections.attention.report import attention_plot

        return attention_plot(plt, models, folder)

    def paired(
        self, model: dict[str, Any], reference: dict[str, Any], resamples: int, seed: int, notes: list[str]
    ) -> list[dict[str, Any]]:
        """The share of attention beyond the original window, model − reference, on the same documents."""
        from ctxext.evaluation.sections.attention.report import attention_rows

        return attention_rows(model, reference, resamples, seed)

    def paired_markdown(self, rows: list[dict[str, Any]], reference: str) -> list[str]:
        """One table: Δ share beyond the window [95 % CI] per model."""
        from ctxext.evaluation.sections.attention.report import attention_paired_markdown

        return attention_paired_markdown(rows, reference)

    def paired_summary(self, rows: list[dict[str, Any]], reference: str) -> list[str]:
        """The difference in the share beyond the original window, per model."""
        from ctxext.evaluation.sections.attention.report import attention_paired_summary

        return attention_paired_summary(rows, reference)

    def card_rows(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """One row per model: the layer means (the report has the per-layer table)."""
        from ctxext.evaluation.sections.attention.report import attention_card_rows

        return attention_card_rows(models)

    def summary(self, entry: dict[str, Any]) -> str | list[str] | None:
        """Means over layers: beyond the original window, on sinks, entropy."""
        from ctxext.evaluation.sections.attention.report import attention_summary

        return attention_summary(entry)
