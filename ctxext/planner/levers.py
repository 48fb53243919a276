"""What each memory lever buys for one recipe on one device: every lever toggled alone and re-planned.

The levers are ``train.memory`` (bf16 residual stream, checkpoint offload, tiled MLP, expandable segments), the
tiled logits/loss ctxext always uses (the chunked loss), and two things that cost memory when a recipe has them:
LoRA dropout and a T×T attention mask. Each is planned on and off with everything else as the recipe has it;
the difference in the longest fitting ``seq_len`` ranks them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ctxext.models.devices import Device
from ctxext.planner.footprint import ModelShape, Setup


@dataclass
class LeverEffect:
    """One lever, planned on and off.

    Attributes:
        name: the lever.
        key: the recipe override that turns it on (``""``: always on in ctxext).
        on: whether the recipe's plan uses it.
        longest_on: the longest fitting seq_len with it.
        longest_off: … without it.
        total_on: the peak at the recipe's seq_len with it, bytes.
        total_off: … without it.
    """

    name: str
    key: str
    on: bool
    longest_on: int | None
    longest_off: int | None
    total_on: int
    total_off: int

    @property
    def buys(self) -> int:
        """Tokens of longest seq_len the lever adds."""
        return (self.longest_on or 0) - (self.longest_off or 0)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record (``ctxext plan --json``)."""
        gib = 2**30
        return dataclasses.asdict(self) | {
            "buys": self.buys,
            "total_on_gib": self.total_on / gib,
            "total_off_gib": self.total_off / gib,
        }


def lever_fields(recipe: Any, device_kind: str, compute_bytes: int) -> dict[str, Any]:
    """The :class:`Setup` fields of a recipe's memory levers on a device, resolved as the training path does."""
    from ctxext.recipe.memory import recipe_levers

    dtype = recipe.quantization.compute_dtype
    dtype = ("bfloat16" if compute_bytes == 2 else "float32") if dtype == "auto" else dtype
    levers = recipe_levers(recipe, device_kind, dtype)
    quantized = recipe.quantization.mode != "none"
    # Rows with segments (document mask, short rows, task rows) reach SDPA as a T×T mask (training/data/rows.py).
    tasks = any(s.task and s.weight > 0 for s in recipe.data.mixture or [])
    return {
        "residual_bytes": 2 if levers.residual_dtype == "bf16" else 4 if quantized else 0,
        "offload_checkpoints": levers.offload_checkpoints,
        "tiled_mlp": levers.tiled_mlp,
        "expandable_segments": levers.expandable_segments,
        "lora_dropout": recipe.lora.dropout,
        "row_mask": bool(recipe.data.document_mask or recipe.data.short_fraction > 0 or tasks),
    }


def lever_candidates(s: Setup, device: Device) -> list[tuple[str, str, dict[str, Any], dict[str, Any], bool]]:
    """(name, key, setup fields when on, when off, on in this setup) of the levers that apply here."""
    rep: list[tuple[str, str, dict[str, Any], dict[str, Any], bool]] = []
    cuda = device.kind == "cuda"
    if s.quantized and s.compute_bytes == 2:
        rep.append(
            (
                "bf16 residual stream",
                "train.memory.residual_dtype=bf16",
                {"residual_bytes": 2},
                {"residual_bytes": 4},
                s.residual == 2,
            )
        )
    if cuda and s.checkpointing:
        rep.append(
            (
                "checkpoint offload to host memory",
                "train.memory.offload_checkpoints=true",
                {"offload_checkpoints": True},
                {"offload_checkpoints": False},
                s.offload_checkpoints,
            )
        )
    shards = s.tiled_mlp if s.tiled_mlp is not None else 0
    rep.append(
        (
            "tiled MLP",
            "train.memory.tiled_mlp=true",
            {"tiled_mlp": shards},
            {"tiled_mlp": None},
            s.tiled_mlp is not None,
        )
    )
    rep.append(("tiled logits/loss (chunked loss)", "", {"loss": "chunked"}, {"loss": "full"}, s.loss == "chunked"))
    if cuda:
        rep.append(
            (
                "expandable segments",
                "train.memory.expandable_segments=true",
                {"expandable_segments": True},
                {"expandable_segments": False},
                s.expandable_segments,
            )
        )
    if s.lora_dropout > 0:
        rep.append(
            ("no LoRA dropout", "lora.dropout=0", {"lora_dropout": 0.0}, {"lora_dropout": s.lora_dropout}, False)
        )
    if s.row_mask and s.attention != "flash_attention_2" and s.sequence_parallel == 1 and cuda:
        rep.append(
            (
                "no T×T mask (flash-attn's varlen path)",
                "model.attn_implementation=flash_attention_2",
                {"attention": "flash_attention_2"},
                {"attention": s.attention},
                False,
            )
        )
    return rep


def lever_advice(setup: Setup, device: Device) -> list[tuple[str, list[str], str, Setup]]:
    """Advice items (summary, overrides, launch, new setup) for the levers a recipe has off."""
    return [
        (name, [key], "", dataclasses.replace(setup, **on))
        for name, key, on, _, used in lever_candidates(setup, device)
        if key and not used
    ]


def lever_effects(
    shape: ModelShape,
    setup: Setup,
    device: Device,
    peak: Callable[[ModelShape, Setup, Device], int],
    longest: Callable[[ModelShape, Setup, Device], int | None],
) -> list[LeverEffect]:
    """Each lever planned on and off, the others as in ``setup``; the largest gain in longest seq_len first.

    Args:
        shape: the model.
        setup: the recipe's setup.
        device: the device.
        peak: the planned peak of a setup (the planner's, with the device's overheads).
        longest: the longest fitting seq_len of a setup.
    """
    out = []
    for name, key, on, off, used in lever_candidates(setup, device):
        with_it, without = dataclasses.replace(setup, **on), dataclasses.replace(setup, **off)
        out.append(
            LeverEffect(
                name,
                key,
                used,
                longest(shape, with_it, device),
                longest(shape, without, device),
                peak(shape, with_it, device),
                peak(shape, without, device),
            )
        )
    return sorted(out, key=lambda e: (-e.buys, e.total_on - e.total_off))
