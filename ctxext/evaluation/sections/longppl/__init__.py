"""The ``longppl:`` suite section: perplexity on the key tokens that need the far context (:mod:`.engine`).

Its folder: the settings (:mod:`.settings`), the engine (:mod:`.engine`), the results' schema (:mod:`.schema`)
and ``report.md`` (:mod:`.report`). The key tokens are chosen once per run — the union of every model's own, or
one named evaluator's — and every model is scored on them; the choice needs every model's scores, so the section
keeps them from :meth:`begin` to :meth:`finish` and fills every model's entry at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxext.evaluation.sections import SuiteRun, SuiteSection, register_section
from ctxext.evaluation.sections.longppl.schema import LongPPL
from ctxext.evaluation.sections.longppl.settings import LongPPLSettings

if TYPE_CHECKING:
    from ctxext.evaluation.sections.longppl.engine import LongPPLRun


@register_section
class LongPPLSection(SuiteSection):
    """LongPPL and plain perplexity on the same documents, per model and length, with the key-token count."""

    name = "longppl"
    title = "LongPPL: perplexity on the tokens that need the far context"
    settings = LongPPLSettings
    schema = LongPPL
    order = 70
    data_keys = ("data",)

    def __init__(self) -> None:
        self._run: LongPPLRun | None = None

    def begin(self, settings: Any, run: SuiteRun) -> None:
        """Check the evaluator label and the short context against the run; start a fresh selection."""
        from ctxext.evaluation.sections.longppl.engine import resolve_run

        self._run = resolve_run(settings, run.models, run.original, run.context)

    def describe_data(self, settings: Any) -> dict[str, Any] | None:
        """The documents' source (:func:`ctxext.scoring.texts.describe_source`)."""
        from ctxext.scoring.texts import describe_source

        return describe_source(settings.data, settings.text_field, settings.split)

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """Score one model (its LongPPL is filled in by :meth:`finish`, once every model has run)."""
        from ctxext.evaluation.lengths import check_lengths
        from ctxext.evaluation.sections.longppl.engine import score_model

        if self._run is None:
            raise RuntimeError("the longppl section runs inside ctxext.evaluation.suite.run_suite (begin, run, finish)")
        check_lengths(loaded, lengths, beyond_context_ok)
        score_model(loaded, settings, self._run, lengths, show)
        return {"evaluator": self._run.evaluator, "note": "scored; completed when every model has run"}

    def finish(self, settings: Any, entries: list[dict[str, Any]]) -> None:
        """Every model's LongPPL on the same key tokens (the union of every model's, or the evaluator's)."""
        from ctxext.evaluation.sections.longppl.engine import model_result, select_keys

        run, self._run = self._run, None
        if run is None:
            return
        select_keys(run, settings)
        for entry in entries:
            if entry["name"] in run.models:
                entry[self.name] = model_result(entry["name"], settings, run)

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """One table: LongPPL, perplexity and key tokens per length and model, with the paired ratio."""
        from ctxext.evaluation.sections.longppl.report import longppl_markdown

        return longppl_markdown(models, report, self.title)
