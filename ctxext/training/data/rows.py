"""Training rows → model inputs: labels, position ids (per-document restarts, PoSE) and the attention mask.

A training row is ``seq_len`` token ids, optionally with

* ``segments``: the document (or short block, or task sample) each token belongs to, numbered from 0
  within the row. Tokens attend only inside their own segment and positions restart at each segment's
  start, so a packed row computes exactly what its documents would compute alone (``data.document_mask``,
  ``data.short_fraction``). The last token of a segment is not trained to predict the next segment's
  first token.
* ``targets``: 1 where the token is a training target (``answer_only`` tasks mark only the answer).
* ``pose``: 1 when the row's position ids are drawn by PoSE (:mod:`ctxext.training.data.pose`), per segment.
* ``positions``: the row's own position ids (task rows under PoSE, whose skips set their needle distances:
  :mod:`ctxext.training.data.task_rows`); ``-1`` in a row that has none.

How the mask reaches the model depends on the attention backend (transformers 5.24):

* ``sdpa``: a 4D boolean mask (causal and same segment) when a row has several segments; otherwise an
  all-ones 2D mask whenever position ids are passed. The explicit mask matters: with
  ``attention_mask=None`` transformers treats every position-id jump as the start of a new packed
  sequence (``masking_utils.find_packed_sequence_indices``), which would cut a PoSE row at its skips.
* ``eager``: the same, but the 4D mask is *additive* float32 (0 where attention is allowed, the
  dtype's minimum where it is not). transformers hands a 4D mask to the attention function as it is,
  and eager attention adds it to the scores: a boolean mask would add +1 to the allowed scores and
  nothing to the masked ones, so every token would see the future and the other documents.
* ``flash_attention_2``: no mask; the micro-batch is flattened into one row and transformers derives
  variable-length sequences (``cu_seqlens``) from the position ids that restart at 0: every row and
  every segment starts at 0, and PoSE skips never return to 0, so that is exact here too (GPU only,
  not run on the CPU test machines).

A row without segments, targets or PoSE gives ``position_ids=None`` and ``attention_mask=None``: the
model's default path, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ctxext.training.data.pose import example_generator, pose_position_ids

IGNORE_INDEX = -100


@dataclass
class ModelInputs:
    """What one micro-batch feeds the model.

    Attributes:
        input_ids: ``(B, T)`` token ids.
        labels: ``(B, T)`` next-token targets, already shifted (``-100``: not scored).
        position_ids: ``(B, T)`` positions, or ``None`` for the default ``0..T-1``.
        attention_mask: a 2D ``(B, T)`` boolean mask, a 4D ``(B, 1, T, T)`` boolean mask (``sdpa``) or additive
            float mask (``eager``), or ``None`` (causal).
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None

    def to(self, device: torch.device) -> ModelInputs:
        """The same inputs on ``device``."""

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return ModelInputs(
            self.input_ids.to(device), self.labels.to(device), move(self.position_ids), move(self.attention_mask)
        )


def segment_positions(segments: torch.Tensor) -> torch.Tensor:
    """Positions that restart at 0 at every segment start (``segments``: ``(B, T)``, non-decreasing per row)."""
    t = segments.shape[-1]
    idx = torch.arange(t).expand_as(segments)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    # The index of the latest segment start at or before each token.
    first = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=-1).values
    return idx - first


def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """``(B, 1, T, T)`` boolean mask: True where query ``i`` may attend key ``j`` (``j ≤ i``, same segment)."""
    t = segments.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    same = segments.unsqueeze(-1) == segments.unsqueeze(-2)
    return (same & causal).unsqueeze(1)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive form of a boolean attention mask: 0 where True, ``dtype``'s minimum where False.

    Eager attention adds the mask to the scores. The minimum (not ``-inf``) keeps softmax finite, and a
    float32 mask promotes lower-precision scores to float32, where eager attention takes its softmax anyway.
    """
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)


def shifted_labels(input_ids: torch.Tensor) -> torch.Tensor:
    """Labels aligned with positions (position t is scored on token t+1; the last is ignored).

    Shifting before the forward keeps the loss correct when context parallelism splits the sequence.
    """
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, :-1] = input_ids[:, 1:]
    return labels


def build_inputs(
    rows: dict[str, torch.Tensor],
    *,
    attn_implementation: str,
    target_length: int | None = None,
    pose_chunks: int | None = None,
    seed: int = 0,
    first_example: int = 0,
) -> ModelInputs:
    """The model inputs of a micro-batch of training rows.

    Args:
        rows: ``input_ids`` ``(B, T)`` and optionally ``segments``, ``targets``, ``pose``, ``positions`` (see the
            module doc).
        attn_implementation: the model's attention backend.
        target_length: positions PoSE may reach (``rope.target_length``).
        pose_chunks: PoSE chunks, or ``None`` for no PoSE.
        seed: the run seed (PoSE draws).
        first_example: the global number of the first row (PoSE draws are a function of it).

    Returns:
        The :class:`ModelInputs`.
    """
    ids = rows["input_ids"]
    labels = shifted_labels(ids)
    segments = rows.get("segments")
    targets = rows.get("targets")
    if targets is not None:
        labels[:, :-1] = labels[:, :-1].masked_fill(targets[:, 1:] == 0, IGNORE_INDEX)
    if segments is not None and not bool((segments[:, -1] != segments[:, 0]).any()):
        segments = None  # every row is one document: nothing to keep apart
    if segments is not None:
        # No token learns to predict the first token of the next document from the previous one.
        labels[:, :-1] = labels[:, :-1].masked_fill(segments[:, 1:] != segments[:, :-1], IGNORE_INDEX)
    use_pose = pose_chunks is not None and target_length is not None
    pose_rows = rows.get("pose")
    stored = rows.get("positions")
    if segments is None and not use_pose and stored is None:
        return ModelInputs(ids, labels)
    if segments is not None:
        positions = segment_positions(segments)
    else:
        positions = torch.arange(ids.shape[1]).expand_as(ids).clone()
    if pose_chunks is not None and target_length is not None:
        for b in range(ids.shape[0]):
            if pose_rows is not None and not int(pose_rows[b]):
                continue
            gen = example_generator(seed, first_example + b)
            seg = segments[b] if segments is not None else torch.zeros(ids.shape[1], dtype=torch.long)
            for s in seg.unique().tolist():
                where = (seg == s).nonzero().squeeze(1)
                if len(where) >= pose_chunks:
                    positions[b, where] = pose_position_ids(len(where), target_length, pose_chunks, gen)
    if stored is not None:
        own = stored[:, 0] >= 0
        positions[own] = stored[own].to(positions.dtype)
    if attn_implementation.startswith("flash"):
        # One flattened row: transformers' flash path cuts it into variable-length sequences wherever the
        # position ids restart at 0 (every row and every segment start there; PoSE skips never return to 0).
        flat = (1, ids.numel())
        return ModelInputs(ids.reshape(flat), labels.reshape(flat), positions.reshape(flat), None)
    if segments is None:
        # 2D: transformers builds the causal mask in each backend's own form from it.
        return ModelInputs(ids, labels, positions, torch.ones_like(ids, dtype=torch.bool))
    mask = block_causal_mask(segments)
    return ModelInputs(ids, labels, positions, additive_mask(mask) if attn_implementation == "eager" else mask)
