"""Suite sections as plugins: one module per section, each one class registered by its suite key.

A section declares its YAML settings (a pydantic model), the lengths it is evaluated at, the data it
reads, how it measures one loaded model, and how its results read in ``report.md``. ``ctxext eval run``
validates, plans, runs and reports every registered section a suite names; nothing else needs editing.
Modules of this package are found by listing it, so adding a section is adding its module; sections
defined elsewhere register with :func:`register_section` once imported. See ``docs/extending.md``.

(The original sections, ``perplexity``, ``passkey``, ``needle``, ``qa``, ``ruler`` and ``attention``,
are still written out in ``ctxext.evaluation.suite`` and the report.)
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel

from ctxext.errors import InputError

Length = int | str

SECTIONS: dict[str, SuiteSection] = {}

# Suite keys that are not sections (the suite's own fields) or are the sections written out in suite.py.
RESERVED = frozenset(
    {"name", "description", "allow_beyond_context", "perplexity", "passkey", "needle", "qa", "ruler", "attention"}
)


@dataclass(frozen=True)
class SuiteRun:
    """What a section knows of the whole run before the first model loads (:meth:`SuiteSection.begin`).

    Attributes:
        models: the report labels of the models, in the order they are evaluated.
        original: the reference model's original context (what ``"1x"`` means).
        context: the reference model's configured context (what ``"target"`` means; the longest of the run).
        reference: the label the paired comparisons use as reference (``None``: the first model).
    """

    models: tuple[str, ...]
    original: int
    context: int
    reference: str | None = None


class SuiteSection:
    """Base class of a suite section.

    Class attributes:
        name: the suite key (``my_task:`` in the YAML) and the key of its results in each model's report entry.
        title: the heading of its part of ``report.md``.
        settings: the pydantic model of its YAML settings (use ``extra="forbid"``: typos are errors).
        data_keys: settings fields that name data (a file or folder is looked up relative to the suite file too).
    """

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    settings: ClassVar[type[BaseModel]]
    data_keys: ClassVar[tuple[str, ...]] = ()

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
            loaded: the :class:`~ctxext.evaluation.loading.LoadedModel`.
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


def register_section(cls: type[SuiteSection]) -> type[SuiteSection]:
    """Class decorator: register a :class:`SuiteSection` subclass under its ``name``.

    Raises:
        ValueError: no name or settings, a name the suite already uses, or a name registered twice.
    """
    if not cls.name or not isinstance(getattr(cls, "settings", None), type):
        raise ValueError(f"{cls.__name__} needs a name and a settings model")
    if cls.name in RESERVED or not cls.name.isidentifier():
        raise ValueError(f"{cls.__name__}: {cls.name!r} is a suite key already, or not an identifier")
    if cls.name in SECTIONS and type(SECTIONS[cls.name]) is not cls:
        previous = type(SECTIONS[cls.name]).__name__
        raise ValueError(f"section {cls.name!r} is registered twice ({previous}, {cls.__name__})")
    SECTIONS[cls.name] = cls()
    return cls


def unregister_section(name: str) -> None:
    """Remove a registered section (a plugin's, or a test's)."""
    SECTIONS.pop(name, None)


def get_section(name: str) -> SuiteSection:
    """The section registered as ``name``.

    Raises:
        InputError: an unknown name (the message lists the known ones).
    """
    if name not in SECTIONS:
        raise InputError(f"unknown suite section {name!r}; registered: {', '.join(SECTIONS) or 'none'}")
    return SECTIONS[name]


def sections_in(suite: BaseModel) -> list[tuple[SuiteSection, Any]]:
    """The registered sections a validated suite names, with their settings, in the suite's order."""
    extra = suite.__pydantic_extra__ or {}
    return [(SECTIONS[key], settings) for key, settings in extra.items() if key in SECTIONS]


def load_builtin_sections() -> None:
    """Import every section module of this package (each registers its class)."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


load_builtin_sections()
