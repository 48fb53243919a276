"""``train.memory``: the levers that lower training memory at long lengths (ALST, unsloth), declared once.

Each lever is a recipe key; ``auto`` turns it on where it is safe (a CUDA run; the bf16 stream on any bf16 run)
and off on the CPU, where the training path computes in fp32 by default and has no pinned accelerator memory. What
each one does to memory is modelled by ``ctxext plan`` (``ctxext/planner/footprint.py``) and written out in
``docs/planning.md``; how it is applied is in ``ctxext/training/levers.py``; :func:`resolve_levers` decides, for a
device, which levers a run uses (training and the planner call the same function).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ctxext.errors import InputError

KEY = "train.memory"


class MemorySection(BaseModel):
    """Memory levers for long sequences (each recorded in ``run.json``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    residual_dtype: Literal["auto", "bf16", "fp32"] = Field(
        default="auto",
        description="dtype of the residual stream: bf16 keeps peft's fp32 embeddings/norms but casts their "
        "outputs (auto: bf16 on a bf16 run, else the compute dtype)",
    )
    offload_checkpoints: Literal["auto"] | bool = Field(
        default="auto",
        description="hold the checkpointed layer inputs in pinned host memory (CUDA only; auto: on with CUDA "
        "and gradient checkpointing)",
    )
    tiled_mlp: Literal["auto"] | bool | int = Field(
        default="auto",
        description="run the gated MLP over sequence shards, each recomputed in the backward pass (true: "
        "ceil(tokens / hidden) shards, ALST's rule; an int: that many; auto: on with CUDA)",
    )
    expandable_segments: bool = Field(
        default=True,
        description="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for the run (CUDA; less fragmentation)",
    )
    fit_micro_batch: bool = Field(
        default=True,
        description="where `ctxext train`'s plan of the step on its machine does not fit, lower "
        "train.micro_batch_size to the largest divisor that fits and raise train.gradient_accumulation_steps by "
        "the same factor (a step sees the same rows), before train.gradient_checkpointing: auto turns on; "
        "decided once when the run starts (not under DeepSpeed, which takes accumulation 1)",
    )

    @field_validator("tiled_mlp")
    @classmethod
    def _shards(cls, value: str | bool | int) -> str | bool | int:
        if not isinstance(value, bool) and isinstance(value, int) and value < 2:
            raise ValueError(f"got {value} shard(s); give at least 2, true (one shard per hidden-size tokens) or false")
        return value


@dataclass(frozen=True)
class Levers:
    """The levers a run uses, resolved (what ``run.json`` records under ``memory``).

    Attributes:
        residual_dtype: ``bf16`` or ``fp32`` (the dtype of the residual stream and the checkpoints).
        offload_checkpoints: checkpointed layer inputs live in pinned host memory.
        tiled_mlp: MLP shards per forward (``0``: ceil(tokens / hidden), ALST's rule), or ``None`` (not tiled).
        expandable_segments: the CUDA allocator uses expandable segments.
    """

    residual_dtype: str = "fp32"
    offload_checkpoints: bool = False
    tiled_mlp: int | None = None
    expandable_segments: bool = False

    def record(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def resolve_levers(
    memory: MemorySection, *, device_type: str, compute_dtype: str, quantized: bool, checkpointing: bool
) -> Levers:
    """The levers of a ``train.memory`` section on a device.

    Args:
        memory: the recipe's :class:`ctxext.recipe.memory.MemorySection`.
        device_type: ``cuda`` or ``cpu``.
        compute_dtype: the compute dtype of the run: ``bfloat16``, ``float16`` or ``float32``.
        quantized: the base is 4-bit or 8-bit (peft upcasts the other weights to fp32).
        checkpointing: gradient checkpointing is on.

    Returns:
        The resolved :class:`Levers`.

    Raises:
        InputError: a lever that cannot run here, naming its key and the way out.
    """
    cuda = device_type == "cuda"
    natural = "fp32" if quantized or compute_dtype == "float32" else "bf16"
    residual: str = memory.residual_dtype
    if residual == "auto":
        residual = "bf16" if compute_dtype == "bfloat16" else natural
    if residual == "bf16" and compute_dtype != "bfloat16":
        how = "a CPU run computes in fp32 unless quantization.compute_dtype says otherwise" if not cuda else ""
        raise InputError(
            f"{KEY}.residual_dtype: bf16 needs a bf16 run; this run computes in {compute_dtype}"
            + (f" ({how})" if how else "")
            + ". Use auto (or fp32), or set quantization.compute_dtype: bfloat16"
        )
    if residual == "fp32" and natural != "fp32":
        raise InputError(
            f"{KEY}.residual_dtype: fp32 would upcast a {compute_dtype} model that is not quantized; "
            "its residual stream is already in the compute dtype. Use auto"
        )
    offload = memory.offload_checkpoints
    if offload == "auto":
        offload = cuda and checkpointing
    elif offload and not cuda:
        raise InputError(
            f"{KEY}.offload_checkpoints: offloading checkpoints needs pinned CUDA memory and this run has no CUDA "
            "device (on the CPU the checkpoints are in host memory already). Use auto or false"
        )
    elif offload and not checkpointing:
        raise InputError(f"{KEY}.offload_checkpoints: needs train.gradient_checkpointing=true (nothing to offload)")
    tiled = memory.tiled_mlp
    if tiled == "auto":
        tiled = cuda
    shards = None if tiled is False else 0 if tiled is True else int(tiled)
    return Levers(residual, bool(offload), shards, bool(memory.expandable_segments and cuda))


def recipe_levers(recipe: Any, device_type: str, compute_dtype: str) -> Levers:
    """:func:`resolve_levers` for a recipe (``train.memory``, its quantization and checkpointing) on a device."""
    return resolve_levers(
        recipe.train.memory,
        device_type=device_type,
        compute_dtype=compute_dtype,
        quantized=recipe.quantization.mode != "none",
        checkpointing=recipe.train.checkpointing,
    )
