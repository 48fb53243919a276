"""PoSE: positional skip-wise training (Zhu et al. 2024), position ids that skip to reach the target.

"PoSE: Efficient Context Window Extension of LLMs via Positional Skip-wise Training". A training row
of ``seq_len`` tokens is cut into chunks; each chunk after the first has its position ids shifted by a
skip, so the row covers relative distances up to ``target_length - 1`` while costing only ``seq_len``
tokens of memory and compute. Two samplings (``train.pose.sampling``):

* ``official`` (the default), as the authors' code does it (``train_preprocess_function_pose`` in
  github.com/dwzhu-pku/PoSE): two chunks; the first chunk's length ``c1`` uniform in
  ``[1, ceil(L/2)]`` (so at most half the row); a position skip ``u`` uniform in
  ``[0, target_length - L]``; and a *content* skip ``v``, drawn independently, uniform in
  ``[0, N - L]`` where ``N`` is the text available (the document read up to ``5 × seq_len`` tokens). The
  row holds ``text[0:c1] + text[c1 + v : L + v]`` at positions ``0..c1-1`` and ``c1 + u .. L - 1 + u``.
  The paper's equation 5 draws ``v`` the same way; its appendix A found ``v = 0`` and ``v = u``
  equally good.
* ``contiguous`` (ctxext's earlier sampling, the paper's equations 3-4 with ``v = 0``): ``chunks``
  pieces whose cut points are uniform over the row (the first is not limited to half), skips
  ``u_1 ≤ … ≤ u_{N-1}`` uniform in ``[0, target_length - seq_len]``, and the text unchanged.

Either way position ids are monotone, start at 0 and stay below ``target_length``. The draws use a
``torch.Generator`` seeded from the run seed and the row (or example), so a resumed run sees exactly
the same rows.

Only static RoPE methods can be trained this way: ``dynamic`` and ``longrope`` choose their frequencies
from the positions being processed, so a PoSE row that reaches far positions would run the long-context
frequencies in some micro-batches and not in others.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

# The official code reads each document up to 5× the training length: the content skip's range.
OFFICIAL_WINDOW = 5


def pose_position_ids(seq_len: int, target_length: int, chunks: int, generator: torch.Generator) -> torch.Tensor:
    """Position ids for one PoSE example.

    Args:
        seq_len: tokens in the training sequence.
        target_length: the context length to cover (position ids stay below it).
        chunks: number of contiguous pieces (2 in the paper).
        generator: the example's random generator.

    Returns:
        A ``(seq_len,)`` long tensor: monotone, starting at 0, max ``< target_length``.

    Raises:
        ValueError: ``chunks`` outside ``[1, seq_len]`` or ``seq_len > target_length``.
    """
    if not 1 <= chunks <= seq_len:
        raise ValueError(f"PoSE chunks must be in [1, seq_len={seq_len}], got {chunks}")
    if seq_len > target_length:
        raise ValueError(f"PoSE: seq_len {seq_len} exceeds target_length {target_length}")
    # Chunk boundaries: chunks-1 distinct cut points in 1..seq_len-1, uniform.
    cuts = (torch.randperm(seq_len - 1, generator=generator)[: chunks - 1] + 1).sort().values
    starts = torch.cat([torch.zeros(1, dtype=torch.long), cuts])
    # Skips: non-decreasing, uniform in [0, target - seq_len]; the first chunk is never shifted.
    room = target_length - seq_len
    skips = torch.randint(0, room + 1, (chunks - 1,), generator=generator).sort().values
    skips = torch.cat([torch.zeros(1, dtype=torch.long), skips])
    positions = torch.arange(seq_len, dtype=torch.long)
    chunk_of = torch.bucketize(positions, starts, right=True) - 1
    return positions + skips[chunk_of]


def example_generator(seed: int, example: int) -> torch.Generator:
    """The generator of one example: a pure function of the run seed and the example's number."""
    # A large odd multiplier keeps (seed, example) pairs from colliding for any realistic run.
    return torch.Generator().manual_seed((seed * 1_000_003 + example) % (2**63 - 1))


def keyed_generator(seed: int, *key: object) -> torch.Generator:
    """A generator that is a pure function of the run seed and a key (e.g. a row's place in the corpus)."""
    digest = hashlib.sha256(repr((seed, *key)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)


def _uniform(low: int, high: int, generator: torch.Generator) -> int:
    """An integer uniform in ``[low, high]`` (both ends included, like ``random.randint``)."""
    return int(torch.randint(low, high + 1, (1,), generator=generator))


def official_pose(
    available: int, seq_len: int, target_length: int, generator: torch.Generator
) -> tuple[list[int], list[int]]:
    """One row drawn as the official PoSE code draws it: which tokens of the text it holds, at which positions.

    Args:
        available: tokens of text the row may read (its document from the row's first token on, at most
            :data:`OFFICIAL_WINDOW` × ``seq_len``).
        seq_len: tokens in the row (``min(available, seq_len)`` are used).
        target_length: positions stay below it.
        generator: the row's random generator.

    Returns:
        ``(take, positions)``: offsets into the text (``text[take]`` is the row) and the row's position ids.
        The first chunk is ``take[:c1] = 0..c1-1``; the second, ``c1 + v .. L - 1 + v``, starts ``v`` tokens of
        text after the first ends, and its positions start ``u`` after ``c1``.

    Raises:
        ValueError: fewer than 2 tokens, or a row longer than ``target_length``.
    """
    length = min(available, seq_len)
    if length < 2:
        raise ValueError(f"PoSE needs at least 2 tokens for 2 chunks, got {length}")
    if length > target_length:
        raise ValueError(f"PoSE: a row of {length} tokens exceeds target_length {target_length}")
    # The same three draws, in the same order, as train_preprocess_function_pose (rt1, rt2, rt).
    first = _uniform(1, (length + 1) // 2, generator)
    content_skip = _uniform(length, available, generator) - length
    position_skip = _uniform(0, target_length - length, generator)
    take = list(range(first)) + list(range(first + content_skip, length + content_skip))
    positions = list(range(first)) + list(range(first + position_skip, length + position_skip))
    return take, positions


def official_pose_row(
    text: Sequence[int], seq_len: int, target_length: int, generator: torch.Generator
) -> tuple[list[int], list[int]]:
    """The token ids and position ids of an official PoSE row cut from ``text`` (see :func:`official_pose`)."""
    window = min(len(text), OFFICIAL_WINDOW * seq_len)
    take, positions = official_pose(window, seq_len, target_length, generator)
    return [int(text[i]) for i in take], positions
