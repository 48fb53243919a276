"""The data types every RoPE module shares, without torch: the errors, what a config says, what a plan writes.

Kept apart from :mod:`ctxext.rope.runtime` and :mod:`ctxext.rope.scaling_types` (which need torch for their
reference and runtime checks) so that the method declarations in :mod:`ctxext.rope.methods`, the recipe schema and
the command line can use them without importing torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ctxext.errors import InputError


class RopeError(InputError, ValueError):
    """A RoPE problem the user can fix: the message says what is wrong and what to do."""


class RopeConfigError(RopeError):
    """One or more invalid RoPE values; ``problems`` maps each field to what is wrong with it."""

    def __init__(self, problems: dict[str, str]):
        self.problems = problems
        lines = [f"  {key}: {msg}" for key, msg in problems.items()]
        super().__init__("invalid RoPE settings:\n" + "\n".join(lines))


class RopeMismatchError(RopeError):
    """The model's runtime RoPE differs from what its config says it should be."""


@dataclass
class RopeState:
    """What a config says about its rotary position embedding.

    Attributes:
        model_type: ``config.model_type`` (``llama``, ``mistral`` …).
        rope_type: transformers rope type (``default``, ``linear``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``).
        rope_theta: the base ``b`` of ``inv_freq_i = b^(-2i/d)``.
        head_dim: attention head dimension.
        rotary_dim: dimensions that rotate (``head_dim × partial_rotary_factor``).
        original_length: the pretraining context ``L`` that scaling factors are relative to.
        current_length: the context the model is configured for now.
        max_position_embeddings: ``config.max_position_embeddings`` as written.
        parameters: the normalised ``rope_parameters`` dict (``type`` folded into ``rope_type``).
        notes: how an ambiguous config was read (and how to override it).
        extension: ``config.ctxext`` of a folder ctxext extended (method, lengths, the base RoPE), else ``{}``.
    """

    model_type: str
    rope_type: str
    rope_theta: float
    head_dim: int
    rotary_dim: int
    original_length: int
    current_length: int
    max_position_embeddings: int
    parameters: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extension: dict[str, Any] = field(default_factory=dict)

    @property
    def factor(self) -> float:
        """The configured scaling factor (1.0 for unscaled RoPE)."""
        return float(self.parameters.get("factor") or 1.0)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)


@dataclass
class RopePlan:
    """The result of an extension: what to write into the config.

    Attributes:
        method: ctxext method name.
        rope_parameters: the new standard ``rope_parameters``.
        max_position_embeddings: the new ``max_position_embeddings``.
        original_length: pretraining length the factor is relative to.
        target_length: the context the model is extended to.
        factor: target / original.
        notes: facts a user should know about this method in transformers.
        rotary_dim: the rotary dimension ``d`` the plan was made for (verification checks it).
        base_parameters: the RoPE the extension starts from (unscaled).
        composed_on: with ``relative_to="current"``, the previous extension this one is stacked on.
    """

    method: str
    rope_parameters: dict[str, Any]
    max_position_embeddings: int
    original_length: int
    target_length: int
    factor: float
    notes: list[str] = field(default_factory=list)
    rotary_dim: int = 0
    base_parameters: dict[str, Any] = field(default_factory=dict)
    composed_on: dict[str, Any] = field(default_factory=dict)
