"""PoSE: positional skip-wise training (Zhu et al. 2024), position ids that skip to reach the target.

"PoSE: Efficient Context Window Extension of LLMs via Positional Skip-wise Training".

A training sequence of ``seq_len`` tokens is cut into ``chunks`` contiguous pieces; each piece after the
first has its position ids shifted by a skip, so the sequence covers relative distances up to
``target_length - 1`` while costing only ``seq_len`` tokens of memory and compute. The paper's
sampling, per example: chunk lengths uniform (every chunk at least one token), skips drawn in
increasing order, ``u_1 ≤ u_2 ≤ … ≤ u_{N-1}`` uniform in ``[0, target_length - seq_len]``; chunk
``i`` gets positions ``start_i + u_i``. Position ids are monotone, start at 0, and stay below
``target_length``.

The draw uses a ``torch.Generator`` the caller seeds from the run seed and the example's place in the
data order, so a resumed run sees exactly the same positions.

Only static RoPE methods can be trained this way: ``dynamic`` and ``longrope`` choose their frequencies
from the length of the sequence being processed, so a ``seq_len``-token sequence would be rotated with
the short-sequence frequencies whatever its position ids say.
"""

from __future__ import annotations

import torch


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
