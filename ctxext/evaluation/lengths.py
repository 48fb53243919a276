"""Evaluation lengths, shared by every suite section: resolving them against a model, and checking them.

Lengths are token counts or expressions relative to a model's context (:func:`resolve_length`): ``"2x"``
(twice the original context), ``"target"`` (the configured context), ``"2x target"`` (past it). A suite
resolves every section's lengths against one reference model (:func:`resolve_lengths`), so all models of a
comparison are measured at the same token counts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ctxext.errors import InputError

Length = int | str

# A suite evaluates every model at the lengths it asks for, past a model's context included (a base beside its
# extension; "2x target"). Past this multiple of the reference context (the longest among the models) a length is
# a typo more often than a measurement (100,000 at a 256 target: minutes of work, no warning): it is refused
# unless the suite sets allow_beyond_context. Degradation past a window shows well within 2-4x.
BEYOND_CONTEXT_FACTOR = 8
# Evaluations that score more tokens than this (per model) print an estimate of their work before they start.
LARGE_WORK_TOKENS = 1_000_000


def resolve_length(value: Length, original: int, context: int) -> int:
    """A length: an int, ``"Nx"`` (N × original context), ``"target"`` (configured context) or ``"Nx target"``."""
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    if text == "target":
        return context
    beyond = re.fullmatch(r"(\d+(?:\.\d+)?)\s*x\s*target", text)
    if beyond:
        return int(round(float(beyond.group(1)) * context))
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*x", text)
    if m:
        return int(round(float(m.group(1)) * original))
    if text.isdigit():
        return int(text)
    raise InputError(
        f"length {value!r}: use a token count, 'Nx' (N × the original context), 'target' or 'Nx target' "
        "(N × the target, to evaluate beyond it)"
    )


def is_beyond_target(value: Length) -> bool:
    """Whether a length asks for a multiple of the target (``"2x target"``): kept past the context."""
    return isinstance(value, str) and re.fullmatch(r"\s*\d+(?:\.\d+)?\s*x\s*target\s*", value.lower()) is not None


def resolve_lengths(
    values: list[Length], original: int, context: int, allow_beyond: bool
) -> tuple[list[int], list[int]]:
    """Resolve a list of suite lengths; returns ``(kept, dropped_beyond_context)``."""
    out, dropped = [], []
    for v in values:
        L = resolve_length(v, original, context)
        # A token count ("1024" as a flag's text too) is kept where it is: only relative lengths are dropped.
        explicit = isinstance(v, int) or str(v).strip().isdigit()
        if L > context and not explicit and not allow_beyond and not is_beyond_target(v):
            dropped.append(L)
        else:
            out.append(L)
    return sorted(set(out)), sorted(set(dropped))


def check_lengths(loaded: Any, lengths: Sequence[int], allow_beyond: bool) -> list[int]:
    """The lengths above the model's configured context; raises unless ``allow_beyond``.

    Args:
        loaded: the model (a :class:`~ctxext.models.load.LoadedModel`).
        lengths: requested lengths.
        allow_beyond: accept (and mark) lengths above the configured context.

    Returns:
        The lengths beyond the context.

    Raises:
        InputError: a length above what the model addresses, saying what it does.
    """
    ctx = loaded.context_length
    beyond = [L for L in lengths if L > ctx]
    if beyond and not allow_beyond:
        raise InputError(
            f"{loaded.name} addresses {ctx} tokens (max_position_embeddings; rope type {loaded.rope.rope_type}, "
            f"original context {loaded.original_length}); lengths {', '.join(map(str, beyond))} are beyond it. "
            f"Use lengths ≤ {ctx}, extend the model first (ctxext extend), or pass --allow-beyond-context to "
            "measure how it degrades past its window."
        )
    return beyond


def check_far_lengths(lengths: Sequence[int], context: int, allowed: bool, where: str) -> None:
    """Refuse lengths above ``BEYOND_CONTEXT_FACTOR`` × ``context`` unless ``allowed``.

    Args:
        lengths: requested lengths in tokens.
        context: the reference context (the longest configured context among the models evaluated).
        allowed: the suite sets ``allow_beyond_context``.
        where: the section, for the message.

    Raises:
        InputError: naming the lengths, their multiple of the context and the key that allows them.
    """
    far = sorted(L for L in lengths if L > BEYOND_CONTEXT_FACTOR * context)
    if far and not allowed:
        raise InputError(
            f"{where}: length {', '.join(f'{L:,}' for L in far)} is {far[-1] / context:.0f}x the reference context "
            f"{context:,}; lengths past {BEYOND_CONTEXT_FACTOR}x it ({BEYOND_CONTEXT_FACTOR * context:,} tokens) are "
            "refused, as each costs at least as many times the work of one at the context. Lower it, or allow it "
            "(--allow-beyond-context on ctxext eval ppl / passkey / needle / qa; allow_beyond_context: true in a suite)"
        )


def work_estimate(what: str, lengths: Sequence[int], per_length: int) -> str | None:
    """One line on the work of an evaluation that scores ``per_length`` sequences at each length, or ``None`` if small.

    Args:
        what: the evaluation, e.g. ``passkey``.
        lengths: the lengths in tokens.
        per_length: sequences scored at each length (depths × trials).
    """
    tokens = per_length * sum(lengths)
    if tokens < LARGE_WORK_TOKENS:
        return None
    return (
        f"{what}: {len(lengths)} length(s) × {per_length} sequence(s) = {len(lengths) * per_length:,} sequences, "
        f"{tokens:,} tokens per model (the longest {max(lengths):,}); attention work grows with the square of the "
        "length"
    )
