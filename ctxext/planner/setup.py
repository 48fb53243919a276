"""The planner's vocabulary: a model's shape, a training setup, and a footprint made of components.

:class:`ModelShape` is what memory depends on in a model's config, :class:`Setup` how one process trains, and
:class:`Footprint` the per-process memory, component by component, each alive in some phases of the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ctxext.errors import InputError
from ctxext.recipe.sections import ALL_LINEAR, INPUT_EMBEDDINGS

GIB = 2**30
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def shape_names(targets: list[str], extras: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ``lora`` section's names in the planner's Llama-shaped model.

    ``all-linear`` is its seven projections, ``embeddings`` its ``embed_tokens``
    (:func:`ctxext.recipe.refusals.resolve_lora_names` does the same on a real model).

    Args:
        targets: ``lora.target_modules``.
        extras: ``lora.extra_trainable``.

    Returns:
        ``(lora_targets, extra_trainable)`` of a :class:`Setup`.
    """
    lora = [n for t in targets for n in (PROJECTIONS if t == ALL_LINEAR else (t,))]
    extra = ["embed_tokens" if x == INPUT_EMBEDDINGS else x for x in extras]
    return tuple(dict.fromkeys(lora)), tuple(dict.fromkeys(extra))


# Decoders whose attention normalises q and k per head (an RMSNorm over head_dim before RoPE): model_type.
QK_NORM = frozenset({"qwen3"})
# Dense decoders whose layers are not the Llama shape the planner models: model_type -> what differs.
UNMODELLED = {"gpt_neox": "a fused query_key_value projection, a two-matrix GELU MLP and parallel residual"}


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a dense Llama-style decoder (Llama, Mistral, Qwen2, …) that memory depends on."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    model_type: str = "llama"
    qk_norm: bool = False

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """Read the sizes from a transformers config.

        Raises:
            InputError: a config that is not a dense decoder of this shape (e.g. mixture of experts).
        """
        need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        missing = [k for k in need if getattr(config, k, None) is None]
        if missing or getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None):
            raise InputError(
                f"the planner models dense Llama-style decoders; this {getattr(config, 'model_type', '?')} config "
                + (f"lacks {', '.join(missing)}" if missing else "is a mixture of experts")
            )
        model_type = str(getattr(config, "model_type", "llama"))
        if model_type in UNMODELLED:
            raise InputError(
                f"the planner models dense Llama-style decoders (q/k/v/o projections, gated MLP); this {model_type} "
                f"config has {UNMODELLED[model_type]}, so its plan would be wrong. Measure a short `ctxext train` "
                "run instead"
            )
        heads = int(config.num_attention_heads)
        return cls(
            vocab=int(config.vocab_size),
            hidden=int(config.hidden_size),
            layers=int(config.num_hidden_layers),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
            intermediate=int(config.intermediate_size),
            tied=bool(getattr(config, "tie_word_embeddings", False)),
            model_type=model_type,
            qk_norm=model_type in QK_NORM,
        )

    def projection_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each decoder-layer projection."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def linear_params(self) -> int:
        """Parameters of all decoder-layer projections (what gets quantized)."""
        return self.layers * sum(a * b for a, b in self.projection_dims().values())

    def module_sizes(self) -> dict[str, int]:
        """Parameter count of every module peft could match by name suffix, by its path."""
        sizes = {"model.embed_tokens": self.vocab * self.hidden, "model.norm": self.hidden}
        if not self.tied:
            sizes["lm_head"] = self.vocab * self.hidden
        for i in range(self.layers):
            sizes[f"model.layers.{i}.input_layernorm"] = self.hidden
            sizes[f"model.layers.{i}.post_attention_layernorm"] = self.hidden
            if self.qk_norm:
                sizes[f"model.layers.{i}.self_attn.q_norm"] = self.head_dim
                sizes[f"model.layers.{i}.self_attn.k_norm"] = self.head_dim
        return sizes

    def params(self) -> int:
        """Every parameter: projections, embeddings, the head (unless tied) and norms."""
        return self.linear_params() + sum(self.module_sizes().values())

    def norm_params(self) -> int:
        """Parameters of every norm (the layers' two, Qwen3's q/k norms, the final one)."""
        return sum(n for k, n in self.module_sizes().items() if k.endswith("norm"))

    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token (projections and the output head)."""
        return self.linear_params() + self.vocab * self.hidden


@dataclass(frozen=True)
class Setup:
    """How one process trains: everything memory depends on besides the model's shape.

    Attributes:
        seq_len: tokens per sequence.
        micro_batch: sequences per forward pass.
        accumulation: micro-batches per optimizer step (memory does not depend on it; advice keeps the batch).
        quantization: ``nf4``, ``int8`` or ``none``.
        double_quant: nf4 quantization constants quantized too.
        compute_bytes: bytes per element of the compute dtype (2: bf16 on GPU, 4: fp32 on CPU).
        lora_r: LoRA rank.
        lora_targets: projection names that get LoRA.
        extra_trainable: module name suffixes trained in full (peft ``modules_to_save``).
        optimizer: ``adamw`` or ``paged_adamw_8bit``.
        checkpointing: gradient checkpointing.
        attention: ``sdpa``, ``flash_attention_2`` or ``eager``.
        loss: ``chunked`` (ctxext) or ``full`` (full-length logits, transformers' own loss).
        loss_chunk: tokens per chunk of the chunked loss.
        world: processes (GPUs) in the job.
        context_parallel: processes a sequence is split over (ring attention, FSDP2).
        sequence_parallel: processes a sequence is split over (Ulysses: ``train.sequence_parallel_size``).
        sharding: ``none`` (one process or DDP), ``fsdp2`` or ``zero3``.
        residual_bytes: bytes of the residual stream (``train.memory.residual_dtype``); 0: what the weights give
            (fp32 after peft's k-bit preparation, else the compute dtype).
        offload_checkpoints: the checkpointed layer inputs live in pinned host memory.
        tiled_mlp: MLP shards (``0``: ceil(tokens / hidden)), or ``None``: not tiled.
        expandable_segments: the CUDA caching allocator uses expandable segments.
        lora_dropout: LoRA dropout probability (a dropped copy of each adapted projection's input is saved).
        row_mask: rows carry segments (document mask, short rows, task rows): SDPA gets a T×T mask.
        finetune: ``lora`` (adapters on a frozen, possibly quantized base: LoRA / QLoRA) or ``full`` (every weight
            trained: bf16 weights, fp32 master weights, gradients and AdamW states, sharded under FSDP2 / ZeRO-3).
        offload_optimizer: the optimizer states (and under ZeRO-3 the fp32 master weights) live in host memory.
        cuda: the process runs on a CUDA GPU (kernels that keep different tensors there: dropout, flash-attn).
    """

    seq_len: int
    micro_batch: int = 1
    accumulation: int = 1
    quantization: str = "nf4"
    double_quant: bool = True
    compute_bytes: int = 2
    lora_r: int = 16
    lora_targets: tuple[str, ...] = PROJECTIONS
    extra_trainable: tuple[str, ...] = ("embed_tokens", "norm")
    optimizer: str = "paged_adamw_8bit"
    checkpointing: bool = True
    attention: str = "sdpa"
    loss: str = "chunked"
    loss_chunk: int = 1024
    world: int = 1
    context_parallel: int = 1
    sequence_parallel: int = 1
    sharding: str = "none"
    residual_bytes: int = 0
    offload_checkpoints: bool = False
    tiled_mlp: int | None = None
    expandable_segments: bool = False
    lora_dropout: float = 0.0
    row_mask: bool = False
    finetune: str = "lora"
    offload_optimizer: bool = False
    cuda: bool = True

    @property
    def residual(self) -> int:
        """Bytes per element of the residual stream and of most saved activations."""
        return self.residual_bytes or self.frozen_float_bytes

    @property
    def quantized(self) -> bool:
        """The base is stored in 4 or 8 bits."""
        return self.quantization != "none"

    @property
    def frozen_float_bytes(self) -> int:
        """Bytes per element of the non-quantized weights (peft upcasts them to fp32 for a k-bit base)."""
        return 4 if self.quantized else self.compute_bytes

    @property
    def local_tokens(self) -> int:
        """Tokens one process holds activations for (a sequence is split over context- or sequence-parallel ranks)."""
        return -(-self.seq_len // self.split) * self.micro_batch

    @property
    def split(self) -> int:
        """Processes one sequence is split over."""
        return self.context_parallel * self.sequence_parallel

    @property
    def shards(self) -> int:
        """How many ways weights, gradients and optimizer state are split."""
        return self.world if self.sharding in ("fsdp2", "zero3") else 1


# The phases of a training step whose memory peaks differ: the end of the forward pass with the loss, the
# backward pass through the layers (at the start of a layer's backward, with all its saved tensors; and inside
# its attention kernel's backward, when the MLP half is freed and the kernel's gradients and buffers exist), and
# the optimizer step. A component lives in some of them.
PHASES = ("loss", "backward", "attention backward", "step")
# Alive from the forward pass through the layers' backward; alive in the layers' backward only.
FWD_BWD = ("loss", "backward", "attention backward")
BACKWARD = ("backward", "attention backward")


# How each component's size is known (by name prefix; the longest match wins, "counted" otherwise): counted
# (sizes of known tensors: the config's shapes × dtypes), measured (equal to a measurement: the saved tensors of a
# layer with autograd's hooks, tests/unit/planner/test_plan_layer.py; full logits' copies), fitted (one constant
# fitted to CPU measurements) or modelled (from the engines' code or typical values, not measured here).
BASIS = {
    "recomputed layer": "measured",
    "all layers' saved tensors": "measured",
    "full logits": "measured",
    "Python + torch runtime": "fitted",
    "CPU attention backward buffers": "fitted",
    "attention backward": "modelled",
    "MLP backward": "modelled",
    "flash-attention backward buffers": "modelled",
    "backward working set": "modelled",
    "dequantized projection": "modelled",
    "final norm + hidden states": "modelled",
    "Ulysses all-to-all buffers": "modelled",
    "one chunk of logits": "modelled",
    "CUDA context": "modelled",
    "allocator fragmentation": "modelled",
    "malloc retention": "modelled",
    "gathered": "modelled",
    "unsharded gradients": "modelled",
    "optimizer step temporaries": "modelled",
    "DDP gradient buckets": "modelled",
}


@dataclass
class Component:
    """One line of the breakdown.

    Attributes:
        group: weights, trainable, activations, loss or overhead.
        name: what it is.
        bytes: its size.
        detail: how it was computed.
        phases: the phases of the step it is alive in (all of them by default).
    """

    group: str
    name: str
    bytes: int
    detail: str = ""
    phases: tuple[str, ...] = PHASES

    @property
    def basis(self) -> str:
        """How its size is known: counted, measured, fitted or modelled (:data:`BASIS`)."""
        match = max((k for k in BASIS if self.name.startswith(k)), key=len, default="")
        return BASIS.get(match, "counted")


@dataclass
class Footprint:
    """Peak memory of one process, by component (and the bytes it sends per micro-batch under Ulysses)."""

    components: list[Component] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    all_to_all: int = 0

    def add(self, group: str, name: str, size: float, detail: str = "", phases: tuple[str, ...] = PHASES) -> None:
        """Append a component (sizes in bytes; zero-size lines are kept out)."""
        if size > 0:
            self.components.append(Component(group, name, int(size), detail, phases))

    def phase_total(self, phase: str) -> int:
        """Bytes alive during one phase of the step."""
        return sum(c.bytes for c in self.components if phase in c.phases)

    @property
    def peak_phase(self) -> str:
        """The phase with the most memory alive."""
        return max(PHASES, key=self.phase_total)

    @property
    def total(self) -> int:
        """The predicted peak, bytes: the largest phase."""
        return max(self.phase_total(p) for p in PHASES)

    def group_total(self, group: str, phase: str | None = None) -> int:
        """Bytes of one group (weights, trainable, activations, loss, overhead), optionally in one phase."""
        return sum(c.bytes for c in self.components if c.group == group and (phase is None or phase in c.phases))
