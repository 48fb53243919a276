"""What a data source may be: the file types ctxext reads, ``builtin:stdlib``, and a local path vs a Hub id.

Training (:func:`ctxext.training.data.corpus.load_documents`), evaluation
(:func:`ctxext.scoring.texts.iter_texts`) and ``ctxext validate`` (:mod:`ctxext.cli.validate`) accept the same
sources; this module is the one place that says which. How each reads them differs by purpose: training loads
through ``datasets`` and wants one kind of file per folder; evaluation reads text files itself and, in a folder,
only the text files.
"""

from __future__ import annotations

from pathlib import Path

from ctxext.models.refs import is_hub_id

# The standard library's own source files (:mod:`ctxext.models.builtin`): ``builtin:stdlib`` and its named splits.
STDLIB_SOURCE = "builtin:stdlib"

# File suffix → the ``datasets`` builder that reads it ("text": one document per file).
FILE_KINDS: dict[str, str] = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".py": "text",
    ".rst": "text",
    ".tex": "text",
}
TEXT_SUFFIXES = tuple(suffix for suffix, kind in FILE_KINDS.items() if kind == "text")
TABLE_SUFFIXES = tuple(suffix for suffix, kind in FILE_KINDS.items() if kind != "text")


def file_kind(path: str | Path) -> str | None:
    """The ``datasets`` builder for a data file (``json``, ``parquet``, ``csv``, ``text``), or ``None``."""
    return FILE_KINDS.get(Path(path).suffix.lower())


def is_stdlib(source: str) -> bool:
    """Whether ``source`` names the built-in standard-library text (``builtin:stdlib`` or ``builtin:stdlib-SPLIT``)."""
    return source == STDLIB_SOURCE or source.startswith(STDLIB_SOURCE + "-")


def stdlib_problem(path: str, text_field: str) -> tuple[str, str] | None:
    """What is wrong with reading the built-in ``path`` (``builtin:stdlib[-SPLIT]``) in ``text_field``, or ``None``.

    Returns:
        ``(what, message)``: ``path`` (an unknown split) or ``text_field`` (the built-in has only ``text``).
    """
    from ctxext.models.builtin import stdlib_source_files

    try:
        stdlib_source_files(path.removeprefix("builtin:"), default_split="train")
    except KeyError as exc:
        return "path", str(exc.args[0])
    if text_field != "text":
        return "text_field", f"builtin:stdlib has only the field 'text', not {text_field!r}"
    return None


def looks_like_path(source: str) -> bool:
    """Whether a source that does not exist locally can only have been meant as a local path, not a Hub data set.

    A Hub data set id is ``name`` or ``org/name`` (:func:`ctxext.models.refs.is_hub_id`) without a file suffix;
    anything else is a path.
    """
    return Path(source).suffix != "" or not is_hub_id(source, bare=True)
