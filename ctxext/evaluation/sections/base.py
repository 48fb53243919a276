"""The base class of a suite section, and what it knows of the run (:class:`SuiteRun`).

A section owns everything about one measurement: its YAML settings (a pydantic model, declared once), its
results' schema, the lengths it is evaluated at, the data it reads, how it measures one loaded model, how its
results read in ``report.md``, its plots, its paired statistics (model against reference, in the report's
``comparisons``), its part of the model card, its console summary and its ``ctxext eval <name>`` subcommand
(flags generated from the settings model). Every hook but :meth:`SuiteSection.run` has a default.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

Length = int | str


@dataclass(frozen=True)
class SuiteRun:
    """What a section knows of the whole run before the first model loads (:meth:`SuiteSection.begin`).

    Attributes:
        models: the report labels of the models, in the order they are evaluated.
        original: the reference model's original context (what ``"1x"`` means).
        context: the reference model's configured context (what ``"target"`` means; the longest of the run).
        reference: the label the paired comparisons use as reference (``None``: the first model).
        refs: each model's reference (folder, Hub id, ``builtin:NAME``), in the order of ``models``.
        chat: what a ``chat_template: auto`` setting uses for every model of the run, decided once from the
            reference model (a :class:`~ctxext.tasks.chat.ChatDecision`; ``None`` when no section asks for ``auto``).
    """

    models: tuple[str, ...]
    original: int
    context: int
    reference: str | None = None
    refs: tuple[str, ...] = ()
    chat: Any = None


class SuiteSection:
    """Base class of a suite section.

    Class attributes:
        name: the suite key (``my_task:`` in the YAML) and the key of its results in each model's report entry.
        title: the heading of its part of ``report.md``.
        settings: the pydantic model of its YAML settings (use ``extra="forbid"``: typos are errors).
        schema: the pydantic model of its results (``None``: kept as they are). Registered with the report
            schema (:func:`ctxext.artifacts.report.register_schema`), so every ``report.json`` read or written
            while the section is registered validates the section's part of each model entry with it.
        data_keys: settings fields that name data (a file or folder is looked up relative to the suite file too).
        order: where the section comes in the run, ``report.md`` and the card (lower first; built-ins below 100).
        command: its ``ctxext eval`` subcommand (default: ``name`` with hyphens).
        paired_key: where its paired rows go in the report's ``comparisons`` (default: ``name``). Sections that
            share a key share one table in ``report.md``, drawn by the first of them (the retrieval grids' is
            ``grids``).
    """

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    settings: ClassVar[type[BaseModel]]
    schema: ClassVar[type[BaseModel] | None] = None
    data_keys: ClassVar[tuple[str, ...]] = ()
    order: ClassVar[int] = 100
    command: ClassVar[str] = ""
    paired_key: ClassVar[str] = ""

    def lengths(self, settings: Any) -> list[Length]:
        """The suite lengths to evaluate at (``1024``, ``"2x"``, ``"target"``…); default ``settings.lengths``.

        They are resolved against the reference model like every section's; ``[]``: the section takes no length.
        """
        return list(getattr(settings, "lengths", []) or [])

    def describe_data(self, settings: Any) -> dict[str, Any] | None:
        """What data the section read, for the report's ``data`` part (``None``: nothing to say)."""
        return None

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """Measure one model.

        Args:
            loaded: the :class:`~ctxext.models.load.LoadedModel`.
            settings: the validated settings.
            lengths: the resolved token lengths (ascending).
            beyond_context_ok: lengths past the model's context are allowed (comparisons, ``2x target``).
            show: show progress.

        Returns:
            The JSON-ready results, stored under ``name`` in the model's report entry.
        """
        raise NotImplementedError

    def begin(self, settings: Any, run: SuiteRun) -> None:
        """Called once per suite run, after validation and before the first model loads; default: nothing.

        A section that measures models against one another (one model's choice applied to all) keeps its
        state from here to :meth:`finish`. Raise :class:`~ctxext.errors.InputError` for settings that only
        the run can judge (a model label): nothing has been computed yet.
        """

    def check(self, settings: Any) -> None:
        """Checks beyond the settings model's, when the suite loads (before any model); default: none.

        Raise :class:`~ctxext.errors.InputError` naming the key (e.g. a task name the task registry lacks).
        """

    def work_note(self, settings: Any) -> str | None:
        """A line on how much the section will score per model, shown before a large run starts; default: none."""
        return None

    def annotate(self, result: dict[str, Any], spec: Any) -> None:
        """Add what the model's source says to its results (its :class:`~ctxext.models.load.ModelSpec`).

        Called after :meth:`run`, with the run's model spec (a run folder's recipe, for instance); default: none.
        """

    def finish(self, settings: Any, entries: list[dict[str, Any]]) -> None:
        """Called once after every model ran, with every model's report entry; default: nothing.

        A section may complete its results in ``entry[self.name]`` here (e.g. scores on a selection that
        needed a model evaluated later than others).
        """

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """The section's part of ``report.md``; by default one table of the results' numbers, a column per model.

        Args:
            models: the report's model entries that have this section (``entry[self.name]`` holds the results).
            report: the whole report.

        Returns:
            Markdown lines.
        """
        keys: list[str] = []
        for m in models:
            keys += [k for k, v in _flat(m[self.name]).items() if k not in keys and isinstance(v, (int, float, str))]
        lines = [f"## {self.title or self.name}", ""]
        lines += ["| | " + " | ".join(m["name"] for m in models) + " |", "|" + " --- |" * (len(models) + 1)]
        for key in keys:
            cells = [_cell(_flat(m[self.name]).get(key)) for m in models]
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
        return lines + [""]

    def plots(self, plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
        """Write the section's PNG plots into ``folder``; by default one plot of its numbers by length.

        The default draws, per model, the numbers of the results' ``by_length`` mapping (``{"512": 0.9}``),
        if it has one; a section without such numbers gets no plot. Plot names should start with the
        section's name: ``report.md`` shows each one under the section's tables.

        Args:
            plt: ``matplotlib.pyplot`` (the ``Agg`` backend is set).
            models: the report's model entries (JSON form) that have this section.
            folder: where to write.

        Returns:
            Plot name → file name (in ``folder``).
        """
        curves = {m["name"]: _numbers_by_length(m[self.name]) for m in models}
        curves = {name: points for name, points in curves.items() if points}
        if not curves:
            return {}
        from ctxext.artifacts.figures import save_figure

        fig, ax = plt.subplots(figsize=(7, 4.2))
        for name, points in curves.items():
            ax.plot([L for L, _ in points], [v for _, v in points], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("length (tokens)")
        ax.set_title(self.title or self.name)
        ax.legend()
        return {self.name: save_figure(fig, folder, f"{self.name}.png")}

    def paired(
        self, model: dict[str, Any], reference: dict[str, Any], resamples: int, seed: int, notes: list[str]
    ) -> list[dict[str, Any]]:
        """Paired statistics of one model against the reference on the same items; default: none.

        Each row needs ``p_value`` (two-sided; NaN when untestable): the report Holm-adjusts it together with
        every other comparison of the report (``p_holm`` is added). The rows are stored under the section's
        name in the report's ``comparisons``.

        Args:
            model: the model's report entry (``model[self.name]`` holds its results).
            reference: the reference model's entry.
            resamples: bootstrap resamples.
            seed: bootstrap seed.
            notes: append a note when the two cannot be paired (say why).

        Returns:
            JSON-ready rows, each naming ``model``.
        """
        return []

    def paired_markdown(self, rows: list[dict[str, Any]], reference: str) -> list[str]:
        """The section's part of the paired comparisons in ``report.md``; by default one table of the rows."""
        keys = list(dict.fromkeys(k for row in rows for k in row))
        lines = [f"### {self.title or self.name}, paired against `{reference}`", ""]
        lines += ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
        lines += ["| " + " | ".join(_cell(row.get(k)) for k in keys) + " |" for row in rows]
        return lines + [""]

    def paired_summary(self, rows: list[dict[str, Any]], reference: str) -> list[str]:
        """Console lines of its paired rows after ``ctxext eval``; default: none (``report.md`` has the table)."""
        return []

    def card_rows(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """The section's lines in the model card's evaluation part; by default its ``report.md`` part.

        The card's headings are its own, so the section's ``## `` heading becomes a line ending in a colon.

        Args:
            models: the report's model entries that have this section.
            report: the whole report (JSON form).

        Returns:
            Markdown lines.
        """
        lines = self.markdown(models, report)
        return [f"{line[3:]}:" if line.startswith("## ") else line for line in lines]

    def card_results(self, entry: dict[str, Any], report: dict[str, Any]) -> list[dict[str, Any]]:
        """The model's results for the card's Hub metadata (``model-index``); default: none.

        Called for the extended model of the report (the last model loaded with an adapter or a patched config).

        Returns:
            Entries of :class:`ctxext.artifacts.report.CardResult` (task, dataset_type, dataset_name, metric, label,
            length, value), JSON-ready.
        """
        return []

    def card_cost(self, extended: dict[str, Any], base: dict[str, Any], report: dict[str, Any]) -> list[str]:
        """The card's short-context cost: the extended model against the unmodified base, inside the base's window.

        Default: nothing (the section says nothing about the cost); the first section that says something is shown.
        """
        return []

    def summary(self, entry: dict[str, Any]) -> str | list[str] | None:
        """The console line(s) of a model after ``ctxext eval``; default: none (the report has the tables)."""
        return None


def _numbers_by_length(result: dict[str, Any]) -> list[tuple[int, float]]:
    # The (length, number) points of a result's "by_length" mapping, in length order.
    by_length = result.get("by_length") if isinstance(result, dict) else None
    if not isinstance(by_length, dict):
        return []
    points = [(int(L), float(v)) for L, v in by_length.items() if str(L).isdigit() and isinstance(v, (int, float))]
    return sorted(points)


def _flat(result: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in result.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
