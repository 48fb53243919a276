"""Evaluation texts: local files, folders, ``datasets`` sets, or the built-in standard-library source.

``builtin:stdlib`` is the held-out part of the Python standard library's source: the files whose
SHA-1 of the path relative to the stdlib root, read as an integer, is divisible by 10 (about 10 % of
the files, the same on every machine with the same Python; the split lives in
:func:`ctxext.models.builtin.stdlib_split` and is shared with training, where plain ``builtin:stdlib`` means
the other 90 %). ``builtin:stdlib-heldout`` / ``builtin:stdlib-train`` name a split explicitly,
``builtin:stdlib-all`` is every file. ``builtin:stdlib-long`` joins the held-out files, in path order
(a package's files stay together), into documents of at least ``LONG_DOC_CHARS`` characters (~128 KB,
about 32k+ tokens for a Llama tokenizer): long documents for 32k+ evaluation lengths on a machine with
no data sets. It is few documents (about eight) of one domain; for real runs use a long-document set
(PG19, proof-pile, code repositories concatenated).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ctxext.errors import InputError
from ctxext.models.data_sources import TABLE_SUFFIXES, TEXT_SUFFIXES, file_kind, looks_like_path

STDLIB_SPLITS = ("stdlib", "stdlib-heldout", "stdlib-train", "stdlib-all", "stdlib-long")
LONG_DOC_CHARS = 128_000


def _stdlib_texts(name: str) -> Iterator[str]:
    from ctxext.models.builtin import stdlib_source_files

    if name == "stdlib-long":
        yield from _stdlib_long_texts()
        return
    # Plain builtin:stdlib evaluates on the held-out split, which training never uses by default.
    for path in stdlib_source_files(name, default_split="heldout"):
        yield path.read_text(encoding="utf-8", errors="replace")


def _stdlib_long_texts() -> Iterator[str]:
    import sysconfig

    from ctxext.models.builtin import stdlib_source_files

    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    size = 0
    for path in stdlib_source_files("stdlib-heldout", default_split="heldout"):
        # A file header keeps the joined document valid Python and marks where each file starts.
        text = f"# ---- {path.relative_to(root).as_posix()} ----\n" + path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        size += len(text)
        if size >= LONG_DOC_CHARS:
            yield "\n".join(parts)
            parts, size = [], 0
    if parts:
        yield "\n".join(parts)


HELDOUT = "builtin:stdlib-heldout"  # the evaluation's held-out files (stdlib-long and builtin:stdlib read them too)


def heldout_overlap(data: str) -> int:
    """How many of the evaluation's held-out files (:data:`HELDOUT`) the data source ``data`` also reads.

    Only the built-in standard-library sources can share files with it: ``builtin:stdlib`` read as evaluation
    data *is* the held-out split, and ``builtin:stdlib-long`` joins the held-out files into long documents.
    """
    from ctxext.models.builtin import stdlib_source_files

    name = data.removeprefix("builtin:")
    if not data.startswith("builtin:") or name not in STDLIB_SPLITS:
        return 0
    chosen = set(stdlib_source_files("stdlib-heldout" if name == "stdlib-long" else name, default_split="heldout"))
    return len(chosen & set(stdlib_source_files(HELDOUT.removeprefix("builtin:"), default_split="heldout")))


def refuse_heldout(data: str, flag: str, use: str, fix: str) -> None:
    """Refuse data that chooses a setting on the evaluation's held-out files (one guard for every workflow).

    Args:
        data: the data source given.
        flag: the flag / key that gave it (named in the message).
        use: what the data would choose (``"the search's fitness"``, ``"the attention temperature"``).
        fix: what to give instead.

    Raises:
        InputError: ``data`` reads some of :data:`HELDOUT`'s files.
    """
    shared = heldout_overlap(data)
    if shared:
        raise InputError(
            f"{flag}: {data} reads {shared} of the evaluation's held-out files ({HELDOUT}; builtin:stdlib and "
            f"builtin:stdlib-long read them too), so {use} would be chosen on the data it is then evaluated on; {fix}"
        )


def describe_source(source: str, text_field: str = "text", split: str = "train") -> dict[str, Any]:
    """A JSON-ready description of a data source for reports."""
    info: dict[str, Any] = {"source": source, "text_field": text_field, "split": split}
    if source.startswith("builtin:"):
        info["note"] = (
            "Python standard-library source; builtin:stdlib = held-out files (int(sha1(relative path)) % 10 == 0)"
        )
        if source == "builtin:stdlib-long":
            info["note"] += f"; stdlib-long = those files joined in path order, documents of >= {LONG_DOC_CHARS} chars"
    return info


def iter_records(source: str, split: str = "train") -> Iterator[dict[str, Any]]:
    """Records (dicts) of a table-like source: a jsonl / json / parquet / csv file or a ``datasets`` set.

    Args:
        source: a file path or a Hub data set id.
        split: the split of a Hub data set.

    Yields:
        One dict per row.

    Raises:
        InputError: the file does not exist or cannot be read as a table.
    """
    path = Path(source).expanduser()
    dataset = _load_table(path, source, split)
    if len(dataset) == 0:
        raise InputError(f"data set {source} is empty (0 rows)")
    yield from dataset


def _load_table(path: Path, source: str, split: str) -> Any:
    import datasets

    if path.exists():
        fmt = file_kind(path)
        if fmt is None or fmt == "text":
            raise InputError(f"{path}: unsupported file type; use {', '.join(TABLE_SUFFIXES)} or a text file")
        from ctxext.models.sources import check_utf8

        check_utf8([path], str(path))
        try:
            return datasets.load_dataset(fmt, data_files=str(path), split="train")
        except Exception as exc:
            from ctxext.models.sources import read_error_message

            raise InputError(read_error_message(exc, path, fmt)) from None
    if looks_like_path(source):
        raise InputError(f"data file {source} does not exist")
    try:
        return datasets.load_dataset(source, split=split)
    except Exception as exc:
        from ctxext.models.sources import hub_error_message

        message = hub_error_message(exc, f"data set {source}")
        raise InputError(message or f"cannot load data set {source} (split {split}): {exc}") from None


def _read_text(path: Path) -> str:
    # Strict UTF-8: replacing undecodable bytes would score the model on text that is not the file's.
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        from ctxext.models.sources import read_error_message

        raise InputError(read_error_message(exc, path, "text")) from None


def iter_texts(source: str, text_field: str = "text", split: str = "train") -> Iterator[str]:
    """Documents of a source, in a deterministic order.

    Args:
        source: ``builtin:stdlib`` (held-out stdlib files, see module doc), a text file (one document), a
            folder of text files (one document per file, sorted by name), a jsonl / json / parquet / csv
            file, or a ``datasets`` Hub id.
        text_field: the column holding the text for table-like sources.
        split: the split of a Hub data set.

    Yields:
        Document texts.

    Raises:
        InputError: a missing file, an unknown built-in, a missing column, or no documents at all.
    """
    count = 0
    for text in _iter_texts(source, text_field, split):
        if text and text.strip():
            count += 1
            yield text
    if count == 0:
        raise InputError(f"data source {source} holds no documents (0 non-empty texts)")


def _iter_texts(source: str, text_field: str, split: str) -> Iterator[str]:
    if source.startswith("builtin:"):
        name = source[len("builtin:") :]
        if name not in STDLIB_SPLITS:
            raise InputError(f"unknown built-in data set {source}; known: builtin:{', builtin:'.join(STDLIB_SPLITS)}")
        yield from _stdlib_texts(name)
        return
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
        if not files:
            raise InputError(f"folder {path} has no text files ({', '.join(TEXT_SUFFIXES)})")
        for f in files:
            yield _read_text(f)
        return
    if path.is_file() and path.suffix.lower() in TEXT_SUFFIXES:
        yield _read_text(path)
        return
    for row in iter_records(source, split):
        if text_field not in row:
            raise InputError(f"{source} has no column {text_field!r}; columns: {', '.join(row)} (use --text-field)")
        value = row[text_field]
        if value is not None and not isinstance(value, str):
            raise InputError(
                f"{source}: column {text_field!r} holds {type(value).__name__} values, not text; use --text-field "
                "to name a column of strings"
            )
        yield value or ""


# Leading tokens of documents, per (tokenizer, source, length, limit): a search and its report read the same ones.
_LEADING: dict[tuple[Any, str, int, int], list[list[int]]] = {}


def tokenizer_key(tokenizer: Any) -> tuple[str, str, int]:
    """A tokenizer's identity for per-process caches: its class, origin and vocabulary size."""
    return type(tokenizer).__name__, str(getattr(tokenizer, "name_or_path", "")), len(tokenizer)


def leading_tokens(tokenizer: Any, source: str, min_tokens: int, limit: int) -> list[list[int]]:
    """The first ``min_tokens`` tokens of up to ``limit`` documents of ``source`` that have that many (cached)."""
    key = (tokenizer_key(tokenizer), source, min_tokens, limit)
    if key not in _LEADING:
        docs: list[list[int]] = []
        for text in iter_texts(source):
            ids = list(tokenizer(text, verbose=False)["input_ids"])
            if len(ids) >= min_tokens:
                docs.append(ids[:min_tokens])
                if len(docs) >= limit:
                    break
        _LEADING[key] = docs
    return [list(d) for d in _LEADING[key]]
