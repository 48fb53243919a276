"""Suite sections as plugins: one folder per section, each one class registered by its suite key.

A section's folder holds everything about its measurement (see ``docs/extending.md``)::

    sections/<name>/__init__.py   the SuiteSection subclass, registered (@register_section)
    sections/<name>/settings.py   its YAML settings (pydantic): the suite keys and its `ctxext eval` flags
    sections/<name>/schema.py     its results' schema (pydantic): how report.json types its part
    sections/<name>/engine.py     how it measures one loaded model
    sections/<name>/report.py     its report.md part, plots, paired statistics, model-card part, console lines

The suite driver (:mod:`ctxext.evaluation.suite`), the report (:mod:`ctxext.evaluation.report`), the paired
comparisons (:mod:`ctxext.evaluation.paired`), the plots and the command line loop over the registry: a new
section is its folder plus its line in :data:`BUILTIN_SECTIONS` (or, outside ctxext, its module imported
with the class decorated by :func:`register_section`). The base class and its hooks: :mod:`.base`.
"""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import BaseModel

from ctxext.errors import InputError
from ctxext.evaluation.sections.base import SuiteRun, SuiteSection

__all__ = [
    "BUILTIN_SECTIONS",
    "RESERVED",
    "SECTIONS",
    "SuiteRun",
    "SuiteSection",
    "get_section",
    "load_builtin_sections",
    "register_section",
    "sections_in",
    "unregister_section",
]

# The built-in sections: one folder each under this package (the registry line of a new section).
BUILTIN_SECTIONS = ("perplexity", "grids", "qa", "ruler", "attention", "harness", "longppl")

SECTIONS: dict[str, SuiteSection] = {}

# Suite keys that are not sections (the suite's own fields) and the keys of the report's comparisons (a
# section's paired rows are stored under its paired_key there; the retrieval grids share "grids").
RESERVED = frozenset(
    {"name", "description", "allow_beyond_context"} | {"reference", "comparisons", "correction", "notes", "grids"}
)


def register_section(cls: type[SuiteSection]) -> type[SuiteSection]:
    """Class decorator: register a :class:`SuiteSection` subclass under its ``name`` (and its results' schema).

    Raises:
        ValueError: no name or settings, a name the suite already uses, a name registered twice, or a schema
            that is not a pydantic model.
    """
    from ctxext.artifacts.report import register_schema

    if not cls.name or not isinstance(getattr(cls, "settings", None), type):
        raise ValueError(f"{cls.__name__} needs a name and a settings model")
    if cls.name in RESERVED or not cls.name.isidentifier():
        raise ValueError(f"{cls.__name__}: {cls.name!r} is a suite key already, or not an identifier")
    if cls.name in SECTIONS and type(SECTIONS[cls.name]) is not cls:
        previous = type(SECTIONS[cls.name]).__name__
        raise ValueError(f"section {cls.name!r} is registered twice ({previous}, {cls.__name__})")
    if cls.schema is not None and not (isinstance(cls.schema, type) and issubclass(cls.schema, BaseModel)):
        raise ValueError(f"{cls.__name__}.schema must be a pydantic model of the section's results")
    if cls.schema is not None:
        register_schema(cls.name, cls.schema)
    SECTIONS[cls.name] = cls()
    ordered = sorted(SECTIONS.items(), key=lambda item: type(item[1]).order)  # stable: registration order next
    SECTIONS.clear()
    SECTIONS.update(ordered)
    return cls


def unregister_section(name: str) -> None:
    """Remove a registered section and its results' schema (a plugin's, or a test's)."""
    from ctxext.artifacts.report import unregister_schema

    if SECTIONS.pop(name, None) is not None:
        unregister_schema(name)


def get_section(name: str) -> SuiteSection:
    """The section registered as ``name``.

    Raises:
        InputError: an unknown name (the message lists the known ones).
    """
    if name not in SECTIONS:
        raise InputError(f"unknown suite section {name!r}; registered: {', '.join(SECTIONS) or 'none'}")
    return SECTIONS[name]


def sections_in(suite: BaseModel) -> list[tuple[SuiteSection, Any]]:
    """The registered sections a validated suite names, with their settings, in the registry's order."""
    extra = suite.__pydantic_extra__ or {}
    return [(SECTIONS[key], settings) for key, settings in extra.items() if key in SECTIONS and settings is not None]


def load_builtin_sections() -> None:
    """Import every built-in section's folder (each registers its class)."""
    for name in BUILTIN_SECTIONS:
        importlib.import_module(f"{__name__}.{name}")


load_builtin_sections()
