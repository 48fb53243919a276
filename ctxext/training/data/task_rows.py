"""Task rows of a training mixture: samples side by side, their needle distances drawn from a stated distribution.

Each sample is its own segment (positions from 0, no attention across samples). Its needle-to-question
distance (:mod:`ctxext.tasks.distance`: in positions, PoSE included) is drawn first, from
``data.task_distance`` over the *span*; under ``data.task_position: uniform`` (not the default) then the
position of its needle, uniformly over what the span leaves after that distance; the sample is built to
realise both. An evaluation at the target puts the needle at every depth of a full-length sample, so its
depth 100 is a near needle after a long prefix, which samples only as long as their distance needs
(``packed``, the default) never train; training it measured no better (``docs/results-training.md``).

* without PoSE the span is the longest sample (``max_length``, at most ``train.seq_len``) and both are token
  counts: a sample holds its prefix (none under ``packed``), needle, distance and question (at least
  ``min_length`` tokens); a sample that overflows its row's room shrinks its prefix to fit if it can, else
  opens the next row; the room a row has left is shared out as extra filler *before* the needles (which
  moves no distance).
* with PoSE (``train.pose``) the span is ``rope.target_length``: sample lengths are drawn as before
  (uniform in ``[min_length, max_length]``), the needle is placed at a token distance that leaves the rest
  to one position skip, put between the needle and the question, and (``uniform``) a second skip before the
  needle (after the first token, which keeps position 0) carries it to its drawn position; these rows carry their
  positions (``positions``) instead of drawing PoSE at training time.

The draws are quasi-random (a golden-ratio sequence from a seeded start), so even a short run's histogram
follows the distribution closely. A distance outside what a sample can hold (shorter than its needle and
question, longer than its length allows) is clamped to the nearest one it can hold (``mixture.json`` counts
them); a span whose last eighth no sample can reach is refused, naming ``data.task_distance``.
``mixture.json`` records the needle positions per eighth of the span beside the distances.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ctxext.errors import InputError
from ctxext.tasks.distance import BINS, DISTRIBUTIONS, expected_shares, histogram, sample_distance

# The fractional part of the golden ratio: its multiples mod 1 fill [0, 1) evenly in any prefix.
GOLDEN = 0.6180339887498949
# Tokens a sample's prompt may need beyond the probe's (keys and names tokenize to varying lengths).
MARGIN = 4


@dataclass
class DistanceDraws:
    """The distances of one task source: drawn, realised, and what the recipe asked for.

    Attributes:
        kind: the distribution (``data.task_distance``).
        span: distances are drawn in ``[0, span)``.
        target_length: with PoSE, the positions a sample may reach; ``None`` without PoSE.
        offset: where the quasi-random sequence starts.
        placement: where a needle sits given its distance (``data.task_position``).
        draws: how many were drawn.
        realised: the distance each sample got.
        positions: the position of each sample's needle (PoSE skips included).
        clamped: samples whose distance was clamped to what they could hold.
    """

    kind: str
    span: int
    target_length: int | None
    offset: float
    placement: str = "packed"
    draws: int = 0
    realised: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    clamped: int = 0

    def next(self) -> int:
        """The next distance."""
        u = (self.offset + self.draws * GOLDEN) % 1.0
        self.draws += 1
        return min(self.span - 1, int(DISTRIBUTIONS[self.kind](u) * self.span))

    def position(self, distance: int, tail: int, rng: random.Random) -> int | None:
        """Where a needle ``distance`` before its query should sit: uniform over what the span leaves.

        ``tail``: the positions a sample needs beyond its distance (needle to answer end). ``None`` under
        ``packed`` (as early as packing leaves it), which draws nothing, so its rows stay as they were.
        """
        if self.placement == "packed":
            return None
        return rng.randint(0, max(0, self.span - tail - distance))

    def record(self, wanted: int, got: int, position: int) -> None:
        """Note a sample's realised distance (``wanted``: the one drawn) and its needle's position."""
        self.realised.append(got)
        self.positions.append(position)
        self.clamped += int(wanted != got)

    def summary(self) -> dict[str, Any]:
        """What ``mixture.json`` records."""
        return {
            "distribution": self.kind,
            "span": self.span,
            "unit": "positions (PoSE)" if self.target_length else "tokens",
            "samples": len(self.realised),
            "clamped": self.clamped,
            "eighths_percent": histogram(self.realised, self.span),
            "expected_percent": [round(100 * s, 1) for s in expected_shares(self.kind)],
            "placement": self.placement,
            "position_eighths_percent": histogram(self.positions, self.span),
        }


@dataclass
class Source:
    """One task source as the row builder needs it."""

    key: str
    task: Any
    templates: list[int]
    options: dict[str, int]
    answer_only: bool
    min_length: int
    max_length: int


def place(src: Source, tokenizer: Any, haystack: Any, length: int, distance: int, template: int, rng: random.Random):
    """A sample of ``length`` tokens whose needle sits ``distance`` tokens before the query (or as near as it can).

    The sample is generated, its distance measured and its depth corrected (up to three times, from the same
    rng state, so keys, names and filler stay the same): other inserts can sit between needle and question.
    """
    state = rng.getstate()
    depth = 0.5
    for _ in range(3):
        rng.setstate(state)
        try:
            sample = src.task.generate(tokenizer, haystack, length, depth, rng, template=template, **src.options)
        except InputError as exc:
            raise InputError(f"{src.key}: {exc}") from None
        gap = sample_distance(sample) - distance
        filler = sample.filler_tokens
        new = min(max(round(depth * filler) + gap, 0), filler) / filler if filler else 0.0
        if gap == 0 or new == depth:
            break
        depth = new
    return sample


def overheads(src: Source, tokenizer: Any, haystack: Any, draws: DistanceDraws) -> dict[int, tuple[int, int]]:
    """Per template: the shortest distance a sample can have, and its length beyond its longest distance.

    Raises:
        InputError: a template whose longest distance misses the last eighth of the span.
    """
    out = {}
    for template in src.templates:
        near, far = (
            place(src, tokenizer, haystack, src.max_length, d, template, random.Random(f"probe:{template}"))
            for d in (0, src.max_length)
        )
        lowest, tail = sample_distance(near), src.max_length - sample_distance(far) + MARGIN
        if tail >= draws.span / BINS:
            where = "rope.target_length" if draws.target_length else "train.seq_len / max_length"
            raise InputError(
                f"data.task_distance: {draws.kind} distances over 0–{draws.span} cannot be met by {src.key} "
                f"({src.task.name}, template {template}): its longest sample reaches only {draws.span - tail}, "
                f"short of the last eighth of the span ({draws.span - draws.span // BINS}+); raise {where}"
            )
        out[template] = (lowest, tail)
    return out


def _row(samples: list[tuple[Any, list[int] | None]], answer_only: bool, stats: Counter) -> dict[str, Any]:
    toks: list[int] = []
    segs: list[int] = []
    tgts: list[int] = []
    pos: list[int] = []
    for seg, (sample, positions) in enumerate(samples):
        start, end = sample.answer_span
        toks += sample.ids
        segs += [seg] * len(sample.ids)
        tgts += [int(start <= i < end) for i in range(len(sample.ids))] if answer_only else [1] * len(sample.ids)
        pos += positions if positions is not None else list(range(len(sample.ids)))
        stats[f"template {sample.template}"] += 1
        stats["samples"] += 1
    with_positions = any(p is not None for _, p in samples)
    return {"input_ids": toks, "segments": segs, "targets": tgts, "pose": 0 if with_positions else 1, "positions": pos}


def token_distance_rows(
    src: Source,
    tokenizer: Any,
    haystack: Any,
    n_rows: int,
    seq_len: int,
    seed: int,
    draws: DistanceDraws,
    stats: Counter,
) -> list[dict[str, Any]]:
    """Rows without PoSE: each sample as long as its drawn prefix and distance need; a row's room shared out."""
    tails = overheads(src, tokenizer, haystack, draws)
    pending: list[tuple[int, int, int | None]] = []
    rows = []
    for r in range(n_rows):
        rng = random.Random(f"{seed}:{src.key}:{r}")
        planned: list[list[int]] = []  # [distance, template, length]
        used = 0
        while seq_len - used >= src.min_length:
            d, template, prefix = pending.pop() if pending else (draws.next(), rng.choice(src.templates), None)
            tail = tails[template][1]
            d_fit = min(d, src.max_length - tail)
            if prefix is None:
                prefix = draws.position(d_fit, tail, rng) or 0
            # The prefix (filler before the needle) is the needle's position: a sample holds it whole.
            need = max(src.min_length, d_fit + tail + prefix)
            if used + need > seq_len:
                if prefix and used + max(src.min_length, d_fit + tail) <= seq_len:
                    need = seq_len - used  # its prefix shrinks to the room the row has left
                else:
                    pending.append((d, template, prefix))  # opens the next row
                    break
            planned.append([d, template, need])
            used += need
        # The room left: extra filler before the needles of random samples (no distance moves), within max_length.
        extra = seq_len - used
        while extra:
            open_ = [p for p in planned if p[2] < src.max_length]
            chosen = rng.choice(open_) if open_ else planned[-1]  # all full: the last takes what is left
            add = rng.randint(1, min(extra, src.max_length - chosen[2]) if open_ else extra)
            chosen[2] += add
            extra -= add
        samples: list[tuple[Any, list[int] | None]] = []
        for d, template, length in planned:
            sample = place(src, tokenizer, haystack, length, d, template, rng)
            assert sample.needle_span is not None  # place() measured it
            draws.record(d, sample_distance(sample), sample.needle_span[0])
            samples.append((sample, None))
        rows.append(_row(samples, src.answer_only, stats))
    return rows


def pose_distance_rows(
    src: Source,
    tokenizer: Any,
    haystack: Any,
    n_rows: int,
    seq_len: int,
    seed: int,
    draws: DistanceDraws,
    stats: Counter,
) -> list[dict[str, Any]]:
    """Rows with PoSE: lengths drawn as before; distance and needle position reached with a skip before each."""
    assert draws.target_length is not None
    limits = overheads(src, tokenizer, haystack, draws)
    rows = []
    for r in range(n_rows):
        rng = random.Random(f"{seed}:{src.key}:{r}")
        samples: list[tuple[Any, list[int] | None]] = []
        used = 0
        while used < seq_len:
            remaining = seq_len - used
            top = max(src.min_length, min(src.max_length, remaining))
            length = rng.randint(src.min_length, top)
            if remaining - length < src.min_length:
                length = remaining
            d, template = draws.next(), rng.choice(src.templates)
            lowest, tail = limits[template]
            room = draws.target_length - length
            at = draws.position(d, tail, rng)
            # A token distance the skip can complete: at most d, at least d - room, within the sample.
            lo, hi = max(lowest, d - room), min(length - tail, d)
            if at is not None:
                # At most ``at`` tokens before the needle, so a skip before it can reach ``at``; a sample too
                # long for that puts its needle as early as its distance allows.
                lo = min(max(lo, length - tail - at), hi)
            t = rng.randint(lo, hi) if lo <= hi else min(max(d - room, lowest), length - tail)
            sample = place(src, tokenizer, haystack, length, t, template, rng)
            got = sample_distance(sample)
            skip = min(max(d - got, 0), room)
            assert sample.needle_span is not None  # place() measured it
            needle, query = sample.needle_span[0], sample.answer_span[0] - 1
            # The skip before the needle (placed only) starts after the first token, which keeps position 0.
            before = min(max(at - needle, 0), room - skip) if at is not None and needle else 0
            first = rng.randint(1, needle) if before else 0
            cut = rng.randint(min(sample.needle_span[1], query), query)
            positions = [i + (before if i >= first else 0) + (skip if i >= cut else 0) for i in range(length)]
            draws.record(d, sample_distance(sample, positions), positions[needle])
            samples.append((sample, positions))
            used += length
        rows.append(_row(samples, src.answer_only, stats))
    return rows
