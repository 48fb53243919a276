"""Document selection for NLL evaluations: tokenize with the tokenizer's defaults, keep those long enough.

Also the content key that pairs documents across models' reports, and the error that says which length
the documents do not reach and how to fix it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ctxext.errors import InputError


@dataclass
class Documents:
    """Tokenized documents selected for a perplexity run.

    Attributes:
        ids: token ids of each selected document.
        read: documents read from the source.
        too_short: documents read but shorter than the shortest length.
        min_tokens: the length a document needed.
    """

    ids: list[torch.Tensor]
    read: int
    too_short: int
    min_tokens: int


def tokenize_documents(
    texts: Sequence[str] | Any,
    tokenizer: Any,
    min_tokens: int,
    max_docs: int | None = None,
    full_tokens: int | None = None,
) -> Documents:
    """Tokenize with the tokenizer's defaults (BOS included where it adds one), keep those long enough.

    Args:
        texts: document texts (any iterable; read lazily until ``max_docs`` documents are counted).
        tokenizer: a transformers tokenizer.
        min_tokens: the shortest evaluation length.
        max_docs: stop once this many documents are counted.
        full_tokens: count only documents with at least this many tokens towards ``max_docs`` (the longest
            length: the common document set); None counts every kept document.

    Returns:
        The :class:`Documents`.
    """
    kept: list[torch.Tensor] = []
    read = short = counted = 0
    for text in texts:
        read += 1
        ids = tokenizer(text, verbose=False)["input_ids"]
        if len(ids) < min_tokens:
            short += 1
            continue
        kept.append(torch.tensor(ids, dtype=torch.long))
        counted += full_tokens is None or len(ids) >= full_tokens
        if max_docs is not None and counted >= max_docs:
            break
    return Documents(ids=kept, read=read, too_short=short, min_tokens=min_tokens)


LONG_DATA_HINT = (
    "a source with longer documents (builtin:stdlib-long joins held-out stdlib files into documents of "
    "~128 KB; for real runs a long-document set such as emozilla/pg19-test or a local jsonl of books / code "
    "repositories)"
)


def too_short_error(docs: Documents, length: int, what: str, needed: int = 1) -> InputError:
    """The error for documents that do not reach ``length``: how many do, what was read, and the fixes."""
    lengths = sorted(len(d) for d in docs.ids)
    have = f"the longest has {lengths[-1]} tokens" if lengths else "none is long enough for any length"
    reach = sum(1 for n in lengths if n >= length)
    return InputError(
        f"{reach} document(s) reach {length} tokens ({what}), {needed} needed: {docs.read} read, {docs.too_short} "
        f"shorter than {docs.min_tokens} tokens, {len(docs.ids)} kept; {have}. Use shorter --lengths, more "
        f"documents (--max-docs), or {LONG_DATA_HINT}; --min-docs lowers the minimum (not below what a "
        "confidence interval needs)."
    )


def document_key(ids: torch.Tensor) -> str:
    """A short content hash of a document's tokens: how reports of different models pair documents."""
    return hashlib.sha1(ids.numpy().astype(np.int64).tobytes()).hexdigest()[:16]
