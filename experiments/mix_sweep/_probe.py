"""What the sweep's evaluation and probes share: a probe's model and haystack, ``qeval``'s documents and NLLs.

Import as ``from experiments.mix_sweep._probe import …`` (the experiments run as ``python -m
experiments.mix_sweep.NAME`` from the repository root).
"""

from __future__ import annotations

from typing import Any


def probe_model(path: str, haystack_tokens: int = 200_000) -> tuple[Any, Any]:
    """A model loaded for a probe (CPU, one thread) and a stdlib haystack in its tokenizer.

    The sweep's probes score samples built the way ``qeval`` builds them.

    Returns:
        The :class:`ctxext.models.load.LoadedModel` (named after the folder) and the haystack.
    """
    from pathlib import Path

    import torch

    from ctxext.models.load import ModelSpec, load_model
    from ctxext.scoring.texts import iter_texts
    from ctxext.tasks import Haystack

    torch.set_num_threads(1)
    loaded = load_model(ModelSpec(path, name=Path(path).name), device="cpu")
    return loaded, Haystack.from_texts(
        loaded.tokenizer, iter_texts("builtin:stdlib"), haystack_tokens, "builtin:stdlib"
    )


def stdlib_documents(tokenizer: Any, min_tokens: int, count: int = 32) -> list[Any]:
    """The first ``count`` stdlib documents of at least ``min_tokens`` tokens (``qeval``'s perplexity documents)."""
    from ctxext.scoring.documents import tokenize_documents
    from ctxext.scoring.texts import iter_texts

    return tokenize_documents(iter_texts("builtin:stdlib"), tokenizer, min_tokens, count).ids


def document_nll(model: Any, documents: list[Any], length: int) -> Any:
    """Per-token NLL of the first ``length`` tokens of each document: a ``[documents, length - 1]`` tensor."""
    import torch

    from ctxext.scoring.nll import token_nll

    return torch.stack([token_nll(model, d[:length].unsqueeze(0))[0] for d in documents])
