"""The search's fitness: one teacher-forced pass over a fixed set of sequences at the target length.

Two objectives, both "lower is better" and both computed on the **training** split of the data
(``builtin:stdlib`` train files by default; the held-out files are kept for the final report):

* ``needle`` (default, LongRoPE2's needle-driven perplexity): mean NLL per answer token of key/value
  needles hidden in real text at depths spread over the whole target length, scored teacher-forced
  (:func:`ctxext.scoring.answers.score_answers`); the answer is the last tokens of each
  sequence, so every sequence is exactly the target length and runs with the long factors;
* ``needle-worst``: the same needles, but the fitness is the mean answer NLL of the **worst depth**
  (the largest of the per-depth means): a mean over depths can improve by helping the easy depths
  while one depth stays bad, and the retrieval target is "at every depth";
* ``far-ppl``: mean NLL of the tokens beyond the original window (positions ≥ L) of documents cut to
  the target length (:func:`ctxext.scoring.nll.token_nll`).

The set is built once, from a seed, and every candidate is scored on the same sequences: comparisons
between candidates are paired.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ctxext.errors import InputError
from ctxext.scoring.texts import leading_tokens, tokenizer_key

# Objective name -> how the per-item scores of its set become one fitness value (lower is better).
AGGREGATES = {"needle": "mean", "needle-worst": "worst-depth", "far-ppl": "mean"}
OBJECTIVES = tuple(AGGREGATES)
# Depths (fraction of the haystack before the needle) of the search's needles: spread over the whole
# target length, including far back (0) where extension matters most.
SEARCH_DEPTHS = (0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875)


@dataclass
class ItemScores:
    """Per-item results of one scoring pass (items: needle samples or documents).

    Attributes:
        nll_sums: per-item sum of the scored tokens' NLL.
        counts: per-item number of scored tokens.
        correct: per-item retrieval result (needle objective only; None for far-ppl).
    """

    nll_sums: np.ndarray
    counts: np.ndarray
    correct: np.ndarray | None = None

    @property
    def mean_nll(self) -> float:
        """Token-weighted mean NLL over all items."""
        return float(self.nll_sums.sum() / max(1.0, float(self.counts.sum())))

    def depth_nll(self, depths: list[float | None]) -> dict[float, float]:
        """Token-weighted mean NLL of each needle depth (items without a depth are left out)."""
        out: dict[float, float] = {}
        for depth in sorted({d for d in depths if d is not None}):
            mask = np.array([d == depth for d in depths])
            out[depth] = float(self.nll_sums[mask].sum() / max(1.0, float(self.counts[mask].sum())))
        return out


@dataclass
class ObjectiveSet:
    """A fixed set of sequences and what to score in them.

    Attributes:
        kind: ``needle``, ``multikey`` or ``far-ppl``.
        length: tokens per sequence.
        sequences: token ids, each exactly ``length`` tokens.
        spans: ``(start, end)`` of the scored tokens of each sequence.
        depths: the needle depth of each sequence (0–1; None for far-ppl).
        info: JSON-ready description (source, split, seed, sizes) for logs and reports.
    """

    kind: str
    length: int
    sequences: list[list[int]]
    spans: list[tuple[int, int]]
    depths: list[float | None] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    aggregate: str = "mean"

    def fitness(self, scores: ItemScores) -> float:
        """The objective's value from per-item scores: the mean NLL, or that of the worst depth."""
        if self.aggregate == "worst-depth":
            return max(scores.depth_nll(self.depths).values())
        return scores.mean_nll

    def score(self, model: torch.nn.Module, batch_tokens: int | None = None) -> ItemScores:
        """Score every item with the model as it is now (one forward pass per batch)."""
        if self.kind == "far-ppl":
            return _score_far(model, self, batch_tokens or 16384)
        from ctxext.scoring.answers import score_answers

        results = score_answers(model, self.sequences, self.spans, batch_tokens=batch_tokens)
        return ItemScores(
            nll_sums=np.array([r.nll for r in results], dtype=np.float64),
            counts=np.array([r.n_tokens for r in results], dtype=np.float64),
            correct=np.array([r.correct for r in results], dtype=bool),
        )


def _score_far(model: torch.nn.Module, objective: ObjectiveSet, batch_tokens: int) -> ItemScores:
    from ctxext.rope.runtime import reset_dynamic_rope
    from ctxext.scoring.nll import token_nll

    start = objective.spans[0][0]
    per_batch = max(1, batch_tokens // objective.length)
    sums: list[float] = []
    for i in range(0, len(objective.sequences), per_batch):
        ids = torch.tensor(objective.sequences[i : i + per_batch], dtype=torch.long)
        reset_dynamic_rope(model)
        nll = token_nll(model, ids, score_from=start)
        sums += nll.double().sum(dim=1).tolist()
    reset_dynamic_rope(model)
    counts = np.full(len(sums), objective.length - start, dtype=np.float64)
    return ItemScores(nll_sums=np.array(sums, dtype=np.float64), counts=counts)


def far_ppl_set(tokenizer: Any, source: str, length: int, original_length: int, samples: int) -> ObjectiveSet:
    """Documents cut to ``length``; the tokens at positions ``≥ original_length`` are scored.

    Args:
        tokenizer: the model's tokenizer.
        source: a data source (``builtin:stdlib-train`` for the search, ``builtin:stdlib-heldout`` for reports).
        length: the target length.
        original_length: the model's original window ``L``.
        samples: number of documents (the first ones long enough, in the source's order).

    Raises:
        InputError: no document of the source is long enough.
    """
    docs = leading_tokens(tokenizer, source, length, samples)
    if not docs:
        raise InputError(
            f"no document of {source} has {length} tokens; use a data source with longer documents "
            "for --objective far-ppl"
        )
    spans = [(original_length, length)] * len(docs)
    info = {"kind": "far-ppl", "source": source, "documents": len(docs), "scored_from": original_length}
    return ObjectiveSet("far-ppl", length, docs, spans, [None] * len(docs), info)


_HAYSTACKS: dict[tuple[Any, str, int], Any] = {}


def _haystack(tokenizer: Any, source: str, min_tokens: int) -> Any:
    # A report builds several sets from one source: tokenize its texts once per process.
    from ctxext.scoring.texts import iter_texts
    from ctxext.tasks import Haystack

    key = (tokenizer_key(tokenizer), source, min_tokens)
    if key not in _HAYSTACKS:
        _HAYSTACKS[key] = Haystack.from_texts(tokenizer, iter_texts(source), min_tokens, name=source)
    return _HAYSTACKS[key]


def retrieval_set(
    tokenizer: Any,
    source: str,
    length: int,
    depths: tuple[float, ...] | list[float],
    per_depth: int,
    seed: int,
    task: str = "needle",
    templates: list[int] | None = None,
) -> ObjectiveSet:
    """Key/value retrieval samples of exactly ``length`` tokens, the answer last.

    Args:
        tokenizer: the model's tokenizer.
        source: the haystack's data source.
        length: tokens per sample, answer included.
        depths: needle depths (0 = start of the haystack, 1 = right before the question).
        per_depth: samples per depth.
        seed: seeds every sample (``seed``, depth, trial), so a set is the same in every run.
        task: ``needle`` or ``multikey``.
        templates: template indices drawn from (default: the task's training templates).

    Returns:
        The :class:`ObjectiveSet`.
    """
    from ctxext.tasks import get_task

    spec = get_task(task)
    chosen = list(templates) if templates is not None else spec.training_templates()
    haystack = _haystack(tokenizer, source, max(4 * length, 8192))
    sequences: list[list[int]] = []
    spans: list[tuple[int, int]] = []
    sample_depths: list[float | None] = []
    for depth in depths:
        for trial in range(per_depth):
            rng = random.Random(f"{seed}-{task}-{length}-{depth:g}-{trial}")
            template = chosen[rng.randrange(len(chosen))]
            sample = spec.generate(tokenizer, haystack, length, float(depth), rng, template=template)
            sequences.append(sample.ids)
            spans.append(sample.answer_span)
            sample_depths.append(float(depth))
    info = {
        "kind": task,
        "source": source,
        "depths": [float(d) for d in depths],
        "per_depth": per_depth,
        "templates": chosen,
        "seed": seed,
        "samples": len(sequences),
    }
    return ObjectiveSet(task, length, sequences, spans, sample_depths, info)


def build_objective(
    kind: str,
    tokenizer: Any,
    length: int,
    original_length: int,
    samples: int,
    seed: int,
    source: str = "builtin:stdlib-train",
    templates: list[int] | None = None,
) -> ObjectiveSet:
    """The search's fitness set.

    Args:
        kind: ``needle``, ``needle-worst`` or ``far-ppl``.
        tokenizer: the model's tokenizer.
        length: the target length.
        original_length: the original window.
        samples: needle samples (spread evenly over :data:`SEARCH_DEPTHS`) or documents.
        seed: the seed of the needle samples.
        source: where haystacks / documents come from (the training split by default).
        templates: the needle forms used (default: the task's training templates; the search passes the
            forms the base retrieves inside its window, :mod:`ctxext.search.forms`).

    Raises:
        InputError: an unknown objective.
    """
    if kind not in OBJECTIVES:
        raise InputError(f"unknown objective {kind!r}; choose one of: {', '.join(OBJECTIVES)}")
    if kind == "far-ppl":
        return far_ppl_set(tokenizer, source, length, original_length, samples)
    per_depth = max(1, -(-samples // len(SEARCH_DEPTHS)))
    found = retrieval_set(tokenizer, source, length, SEARCH_DEPTHS, per_depth, seed, templates=templates)
    found.aggregate = AGGREGATES[kind]
    found.info["aggregate"] = found.aggregate
    return found
