"""Long documents for training, through ``datasets``: load, split, tokenize, pack.

Sources: local ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` files or text files (or a folder of one kind;
:mod:`ctxext.models.data_sources` lists the types, shared with evaluation), a Hub
data set name, or ``builtin:stdlib`` (the Python standard library's own source files, present on
every machine). The held-out validation split is taken over *documents*, before packing, so no
validation text is ever trained on. Tokenization runs with ``map(num_proc=…)`` and is cached by
``datasets`` (a second run with the same data and tokenizer reads the cache).

Two ways to make training examples of ``seq_len`` tokens:

* packing (default): documents are concatenated, each ending with EOS (and starting with BOS when
  the tokenizer adds one), then cut into blocks of exactly ``seq_len`` tokens; the tail is dropped.
  With ``document_mask: true`` each block also gets a ``segments`` column (which packed document each
  token belongs to): training then restarts positions and blocks attention at every document start
  (:mod:`ctxext.training.data.rows`).
* ``packing: false``: only documents of at least ``min_tokens`` (default ``seq_len``) tokens are
  kept, each truncated to its first ``seq_len`` tokens.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxext.errors import InputError
from ctxext.models.data_sources import FILE_KINDS, file_kind, is_stdlib, looks_like_path, stdlib_problem
from ctxext.training.data.pose import OFFICIAL_WINDOW, keyed_generator, official_pose_row


@dataclass(frozen=True)
class PoseRows:
    """Training rows cut by the official PoSE sampling (:func:`ctxext.training.data.pose.official_pose`).

    Attributes:
        target_length: positions the rows may reach (``rope.target_length``).
        seed: the run seed (each row's draws are a function of it and of the row's place in the corpus).
    """

    target_length: int
    seed: int


@dataclass
class TrainingData:
    """Packed (or filtered) blocks ready for a DataLoader.

    Attributes:
        train: a ``datasets.Dataset`` with ``input_ids`` columns of ``seq_len`` tokens (torch format).
        validation: the same for the held-out documents, or ``None``.
        seq_len: tokens per block.
        documents: number of documents read (before the split).
        train_tokens: tokens in the training blocks.
        summary: a one-line description for logs.
        mixture: for a mixture (:mod:`ctxext.training.data.mixture`), what it holds (written to ``mixture.json``).
        train_documents: the training split's raw documents (a Dataset with the one column ``text``): what a
            mixture cuts short blocks and task haystacks from, so they never hold validation text.
        validation_documents: the held-out raw documents, the same way, or ``None``.
    """

    train: Any
    validation: Any
    seq_len: int
    documents: int
    train_tokens: int
    summary: str
    mixture: dict[str, Any] | None = None
    train_documents: Any = None
    validation_documents: Any = None


def _stdlib_generator(paths: list[str]):
    for path in paths:
        yield {"text": Path(path).read_text(encoding="utf-8", errors="replace"), "source": path}


@functools.lru_cache(maxsize=8)
def _stdlib_paths(path: str) -> tuple[str, ...]:
    # Listing the standard library walks thousands of files; a mixture reads the same source several
    # times (blocks, short blocks, haystack), so the list is computed once per process.
    from ctxext.models.builtin import stdlib_source_files

    # Plain builtin:stdlib trains on the 90 % train split: the evaluator's held-out files stay unseen.
    files = stdlib_source_files(path.removeprefix("builtin:"), default_split="train")
    return tuple(str(p) for p in files if p.stat().st_size >= 1)


def load_documents(path: str, text_field: str = "text", split: str = "train", name: str | None = None) -> Any:
    """Load the raw documents as a ``datasets.Dataset``.

    Args:
        path: a file, a folder of files, a Hub data set name, or ``builtin:stdlib``.
        text_field: the column holding the text.
        split: the split to read.
        name: a Hub data set configuration.

    Returns:
        A Dataset with at least ``text_field``.

    Raises:
        InputError: nothing to read, an unsupported file type, an unreachable Hub, a missing field.
    """
    import datasets

    if is_stdlib(path):
        problem = stdlib_problem(path, text_field)
        if problem:
            raise InputError(f"data.{problem[0]}: {problem[1]}")
        # from_generator caches the result under a fingerprint of the generator and its arguments.
        return datasets.Dataset.from_generator(_stdlib_generator, gen_kwargs={"paths": list(_stdlib_paths(path))})
    local = Path(path).expanduser()
    if local.exists():
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        files = [f for f in files if not f.name.startswith(".")]
        kinds = {file_kind(f) for f in files}
        if not files:
            raise InputError(f"data.path: {local} is an empty folder; put .jsonl, .json, .parquet or .txt files in it")
        if None in kinds or len(kinds) != 1:
            suffixes = sorted({f.suffix or "(none)" for f in files})
            raise InputError(
                f"data.path: {local} holds files of type {', '.join(suffixes)}; use one kind of "
                f"{', '.join(sorted(FILE_KINDS))} files"
            )
        kind = FILE_KINDS[files[0].suffix.lower()]  # every file has this one kind (checked above)
        from ctxext.models.sources import check_utf8

        check_utf8(files, "data.path")
        extra = {"sample_by": "document"} if kind == "text" else {}
        try:
            ds = datasets.load_dataset(kind, data_files=[str(f) for f in files], split="train", **extra)
        except Exception as exc:  # datasets raises many types for unreadable files
            from ctxext.models.sources import read_error_message

            raise InputError(f"data.path: {read_error_message(exc, local, kind)}") from None
    else:
        ds = _load_hub(path, split, name)
    if text_field not in ds.column_names:
        raise InputError(
            f"data.text_field: {path} has no field {text_field!r} ({len(ds)} documents); its fields are: "
            f"{', '.join(ds.column_names) or 'none'}. Set data.text_field=NAME."
        )
    feature = ds.features.get(text_field)
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        kind = getattr(feature, "dtype", None) or type(feature).__name__
        raise InputError(
            f"data.text_field: the field {text_field!r} of {path} holds {kind} values, not text; set "
            "data.text_field to a column of strings"
        )
    return ds


def _load_hub(path: str, split: str, name: str | None) -> Any:
    import datasets

    from ctxext.models.sources import hub_error_message

    if looks_like_path(path):
        raise InputError(f"data.path: {path} does not exist (not a file, a folder, builtin:stdlib or a Hub data set)")
    try:
        return datasets.load_dataset(path, name, split=split)
    except Exception as exc:
        message = hub_error_message(exc, f"data set {path}")
        if message is None and "Couldn't find" in str(exc):
            message = f"data.path: {path} is neither a local path nor a data set on the Hub: {exc}"
        if message:
            raise InputError(message) from None
        raise


def _tokenize_fn(tokenizer: Any):
    eos = tokenizer.eos_token_id

    def tokenize(batch: dict[str, list], idx: list[int]) -> dict[str, list]:
        ids = tokenizer(batch["text"], add_special_tokens=True)["input_ids"]
        # ``doc``: the document's row, so the split can name its raw documents afterwards.
        return {"input_ids": [x + [eos] for x in ids], "length": [len(x) + 1 for x in ids], "doc": idx}

    return tokenize


def text_digest(text: str) -> str:
    """A document's identity for overlap checks: the SHA-1 of its UTF-8 text."""
    return hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()


def select_documents(data: Any, exclude: frozenset[str] = frozenset()) -> Any:
    """The raw documents a data section reads, in one column ``text``.

    The first ``data.max_documents`` documents, without empty ones and without any whose text has a
    digest (:func:`text_digest`) in ``exclude``.

    Raises:
        InputError: see :func:`load_documents`.
    """
    field = data.text_field
    docs = load_documents(data.path, field, data.split, data.name).select_columns([field])
    if data.max_documents is not None and len(docs) > data.max_documents:
        docs = docs.select(range(data.max_documents))
    docs = docs.filter(
        lambda b: [bool(t and t.strip()) and (not exclude or text_digest(t) not in exclude) for t in b[field]],
        batched=True,
    )
    return docs.rename_column(field, "text") if field != "text" else docs


def tokenize_documents(docs: Any, tokenizer: Any, num_proc: int) -> Any:
    """``input_ids`` (BOS where the tokenizer adds one, EOS appended), ``length`` and ``doc`` of each document."""
    return docs.map(
        _tokenize_fn(tokenizer),
        batched=True,
        with_indices=True,
        num_proc=num_proc if len(docs) >= 2 * num_proc else None,
        remove_columns=["text"],
        desc="tokenizing",
    )


def document_blocks(documents: Any, data: Any, tokenizer: Any, block_len: int) -> Any:
    """``block_len``-token blocks of the given raw documents, without a split (packed, or truncated).

    A mixture cuts its short blocks this way from a corpus's :attr:`TrainingData.train_documents`, so they
    come from the very documents the long rows come from.
    """
    tokenized = tokenize_documents(documents, tokenizer, data.num_proc)
    if not data.packing:
        tokenized = tokenized.filter(lambda b: [n >= block_len for n in b["length"]], batched=True)
    return _blocks(tokenized, block_len, data.packing)


def _pack_fn(seq_len: int, segments: bool, pose: PoseRows | None = None):
    def pack(batch: dict[str, list], idx: list[int]) -> dict[str, list]:
        flat = [t for ids in batch["input_ids"] for t in ids]
        n = len(flat) // seq_len
        out: dict[str, list] = {"input_ids": [flat[i * seq_len : (i + 1) * seq_len] for i in range(n)]}
        # The longest document each block touches (length up-sampling picks blocks of long documents).
        doc = [d for d, ids in enumerate(batch["input_ids"]) for _ in ids]
        lengths = [len(ids) for ids in batch["input_ids"]]
        out["doc_tokens"] = [max(lengths[d] for d in set(doc[i * seq_len : (i + 1) * seq_len])) for i in range(n)]
        if segments:
            out["segments"] = [[d - doc[i * seq_len] for d in doc[i * seq_len : (i + 1) * seq_len]] for i in range(n)]
        elif pose is not None and n:
            # The text a PoSE row may skip into: the stream after its block, up to the end of the document the
            # block ends in (never into the next document) and to 5 × seq_len tokens in all.
            ends = list(itertools.accumulate(lengths))
            rows = [
                official_pose_row(
                    flat[i * seq_len : ends[doc[(i + 1) * seq_len - 1]]],
                    seq_len,
                    pose.target_length,
                    keyed_generator(pose.seed, "pose", idx[0], i),
                )
                for i in range(n)
            ]
            out["input_ids"] = [ids for ids, _ in rows]
            out["positions"] = [pos for _, pos in rows]
        return out

    return pack


def _truncate_fn(seq_len: int, pose: PoseRows | None):
    def truncate(batch: dict[str, list], idx: list[int]) -> dict[str, list]:
        if pose is None:
            return {"input_ids": [ids[:seq_len] for ids in batch["input_ids"]], "doc_tokens": batch["length"]}
        # Each row is one document's start, its second chunk read from further on in it (up to 5 × seq_len).
        rows = [
            official_pose_row(
                ids[: OFFICIAL_WINDOW * seq_len], seq_len, pose.target_length, keyed_generator(pose.seed, "pose", j)
            )
            for ids, j in zip(batch["input_ids"], idx, strict=True)
        ]
        return {
            "input_ids": [ids for ids, _ in rows],
            "positions": [pos for _, pos in rows],
            "doc_tokens": batch["length"],
        }

    return truncate


def _describe_lengths(lengths: list[int]) -> str:
    if not lengths:
        return "no documents"
    return (
        f"{len(lengths)} documents, {sum(lengths)} tokens in all; lengths min {min(lengths)}, "
        f"median {int(statistics.median(lengths))}, max {max(lengths)}"
    )


def prepare_data(
    data: Any,
    tokenizer: Any,
    seq_len: int,
    seed: int = 42,
    source_name: str | None = None,
    exclude: frozenset[str] = frozenset(),
    pose: PoseRows | None = None,
) -> TrainingData:
    """Load, split, tokenize and pack the recipe's data into ``seq_len`` blocks.

    Args:
        data: the recipe's ``data`` section.
        tokenizer: the model's tokenizer.
        seq_len: tokens per training example.
        seed: seed of the document-level train/validation split.
        source_name: the data path for messages (defaults to ``data.path``).
        exclude: digests (:func:`text_digest`) of documents to leave out (a mixture's validation documents).
        pose: cut the training rows by the official PoSE sampling (a ``positions`` column; not with
            ``data.document_mask``, whose rows get PoSE per document at training time). Validation rows stay plain.

    Returns:
        The :class:`TrainingData`.

    Raises:
        InputError: empty data, no text field, or no document (or too little text) long enough.
    """
    where = source_name or data.path
    docs = select_documents(data, exclude)
    n_docs = len(docs)
    if n_docs == 0:
        raise InputError(f"data.path: {where} holds no documents with text in field {data.text_field!r}")
    tokenized = tokenize_documents(docs, tokenizer, data.num_proc)
    lengths = list(tokenized["length"])
    min_tokens = data.min_tokens or seq_len
    if not data.packing:
        if min_tokens < seq_len:
            raise InputError(
                f"data.min_tokens: {min_tokens} is below train.seq_len ({seq_len}); without packing every example "
                "must fill a whole block (set data.min_tokens >= train.seq_len or turn packing on)"
            )
        long_enough = [i for i, n in enumerate(lengths) if n >= min_tokens]
        if not long_enough:
            raise InputError(
                f"data: no document of {where} is at least {min_tokens} tokens long ({_describe_lengths(lengths)}). "
                "Lower data.min_tokens / train.seq_len, set data.packing=true, or use longer documents."
            )
        tokenized = tokenized.select(long_enough)
    elif sum(lengths) < seq_len * (2 if data.validation_fraction > 0 else 1):
        raise InputError(
            f"data: {where} is too short to make even one block of {seq_len} tokens for training and one for "
            f"validation ({_describe_lengths(lengths)}). Add documents or lower train.seq_len."
        )
    train_docs, val_docs = _split(tokenized, data.validation_fraction, seed)
    segments = data.packing and data.document_mask
    pose = None if segments else pose
    train = _blocks(train_docs, seq_len, data.packing, segments, pose)
    val = _blocks(val_docs, seq_len, data.packing, segments) if val_docs is not None else None
    if len(train) == 0:
        raise InputError(
            f"data: after holding out {data.validation_fraction:.0%} for validation, the training documents of "
            f"{where} make no block of {seq_len} tokens ({_describe_lengths(lengths)}). Add documents, lower "
            "train.seq_len or data.validation_fraction."
        )
    if val is not None and len(val) == 0:
        val = None
    columns = ["input_ids", "segments"] if segments else ["input_ids"]
    train.set_format("torch", columns=columns + (["positions"] if pose else []), output_all_columns=False)
    if val is not None:
        val.set_format("torch", columns=columns)
    summary = f"{n_docs} documents ({sum(lengths)} tokens) → {len(train)} training blocks of {seq_len} tokens" + (
        f", {len(val)} validation blocks" if val is not None else ", no validation split"
    )
    return TrainingData(
        train=train,
        validation=val,
        seq_len=seq_len,
        documents=n_docs,
        train_tokens=len(train) * seq_len,
        summary=summary,
        train_documents=docs.select(train_docs["doc"]),
        validation_documents=docs.select(val_docs["doc"]) if val_docs is not None else None,
    )


def _split(tokenized: Any, fraction: float, seed: int) -> tuple[Any, Any]:
    n = len(tokenized)
    if fraction <= 0 or n < 2:
        return tokenized, None
    n_val = max(1, round(n * fraction))
    parts = tokenized.train_test_split(test_size=n_val, seed=seed, shuffle=True)
    return parts["train"], parts["test"]


def _blocks(tokenized: Any, seq_len: int, packing: bool, segments: bool = False, pose: PoseRows | None = None) -> Any:
    if packing:
        return tokenized.map(
            _pack_fn(seq_len, segments, pose),
            batched=True,
            batch_size=10_000,
            with_indices=True,
            remove_columns=tokenized.column_names,
            desc="packing",
        )
    return tokenized.map(
        _truncate_fn(seq_len, pose),
        batched=True,
        with_indices=True,
        remove_columns=tokenized.column_names,
        desc="truncating",
    )
