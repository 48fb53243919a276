"""The ``perplexity:`` suite section: perplexity by length, by token position and by context limit.

Its folder: the settings (:mod:`.settings`, the flags of ``ctxext eval ppl``), the engine (:mod:`.engine`), the
results' schema (:mod:`.schema`), ``report.md`` / card / console (:mod:`.report`), plots (:mod:`.plots`) and the
paired ratios against the reference model on the same documents (:mod:`.paired`). Context limits (``2x``,
``target``…) resolve against the reference model like the lengths, so the section keeps the run's contexts from
:meth:`~PerplexitySection.begin`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxext.evaluation.lengths import resolve_length, work_estimate
from ctxext.evaluation.sections import SuiteRun, SuiteSection, register_section
from ctxext.evaluation.sections.perplexity.schema import Perplexity
from ctxext.evaluation.sections.perplexity.settings import PerplexitySettings, auto_bucket


@register_section
class PerplexitySection(SuiteSection):
    """Perplexity by evaluation length and token-position bucket (truncated documents), with 95% CIs.

    The same evaluation as a suite holding only a perplexity: section (ctxext eval run): the flags are that
    section's keys, generated from their declaration, with the same defaults (the same documents).
    """

    name = "perplexity"
    title = "Perplexity"
    settings = PerplexitySettings
    schema = Perplexity
    data_keys = ("data",)
    order = 0
    command = "ppl"

    def __init__(self) -> None:
        self._contexts: tuple[int, int] | None = None

    def begin(self, settings: Any, run: SuiteRun) -> None:
        """Keep the reference model's contexts: the context limits resolve against them."""
        self._contexts = (run.original, run.context)

    def describe_data(self, settings: Any) -> dict[str, Any] | None:
        """The documents' source."""
        from ctxext.scoring.texts import describe_source

        return describe_source(settings.data, settings.text_field, settings.split)

    def work_note(self, settings: Any) -> str | None:
        """How many tokens the lengths given in tokens score (relative ones resolve later, per run)."""
        tokens = [n for n in settings.lengths if isinstance(n, int)]
        return work_estimate("perplexity", tokens, settings.max_docs or 0) if tokens else None

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """One model's perplexities, the section's settings with its lengths, limits and bucket resolved."""
        from ctxext.evaluation.sections.perplexity.engine import evaluate_perplexity

        original, context = self._contexts or (loaded.original_length, loaded.context_length)
        limits = [resolve_length(k, original, context) for k in settings.context_limits]
        resolved = {
            "lengths": lengths,
            "context_limits": [k for k in limits if k < lengths[-1]],
            "bucket_size": auto_bucket(lengths[-1]) if settings.bucket_size == "auto" else settings.bucket_size,
            "allow_beyond_context": beyond_context_ok or settings.allow_beyond_context,
        }
        return evaluate_perplexity(loaded, None, settings.model_copy(update=resolved), show)

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """By length (and all documents), short-context regression, by position, context use."""
        from ctxext.evaluation.sections.perplexity.report import perplexity_markdown

        return perplexity_markdown(models, report)

    def plots(self, plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
        """Perplexity by position, by length, and the context-use curve (each when the results have it)."""
        from ctxext.evaluation.sections.perplexity.plots import perplexity_plots

        return perplexity_plots(plt, models, folder)

    def paired(
        self, model: dict[str, Any], reference: dict[str, Any], resamples: int, seed: int, notes: list[str]
    ) -> list[dict[str, Any]]:
        """``ppl(model) / ppl(reference)`` per length and position bucket, documents resampled jointly."""
        from ctxext.evaluation.sections.perplexity.paired import ratio_rows

        return ratio_rows(model, reference, resamples, seed, notes)

    def paired_markdown(self, rows: list[dict[str, Any]], reference: str) -> list[str]:
        """The ratios ppl(model) / ppl(reference) by length, then by token position."""
        from ctxext.evaluation.sections.perplexity.paired import ratio_markdown

        return ratio_markdown(rows, reference)

    def paired_summary(self, rows: list[dict[str, Any]], reference: str) -> list[str]:
        """The ratio at each length."""
        from ctxext.evaluation.sections.perplexity.paired import ratio_summary

        return ratio_summary(rows, reference)

    def card_rows(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """The protocol, the data, the perplexity tables by length and by position."""
        from ctxext.evaluation.sections.perplexity.report import card_rows

        return card_rows(models, report)

    def card_results(self, entry: dict[str, Any], report: dict[str, Any]) -> list[dict[str, Any]]:
        """Perplexity at every length."""
        from ctxext.evaluation.sections.perplexity.report import card_results

        return card_results(entry, report)

    def card_cost(self, extended: dict[str, Any], base: dict[str, Any], report: dict[str, Any]) -> list[str]:
        """Perplexity at the original context, the base against the extended model."""
        from ctxext.evaluation.sections.perplexity.report import card_cost

        return card_cost(extended, base)

    def summary(self, entry: dict[str, Any]) -> str | list[str] | None:
        """The perplexity at each length (and at the original context)."""
        from ctxext.evaluation.sections.perplexity.report import summary

        return summary(entry)
