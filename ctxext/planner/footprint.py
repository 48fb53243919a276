"""Training memory of one process, by component, from a model's config and a training setup (no weights).

The formulas follow what ctxext's training path does (``ctxext/training/model.py``, ``ctxext/training/run.py``,
``ctxext/training/losses.py``), written out per component in ``docs/planning.md``:

* bitsandbytes 4-bit layers save no activation for the backward pass (the weight is frozen), so only LoRA
  inputs and the non-linear ops' tensors are kept;
* peft's ``prepare_model_for_kbit_training`` casts every non-4-bit floating weight (embeddings, ``lm_head``,
  norms) to float32, so with a quantized base the residual stream, and most saved activations, are float32
  even when the 4-bit layers compute in bf16;
* peft keeps LoRA weights in float32 (``autocast_adapter_dtype``); ``modules_to_save`` adds a trainable copy
  of each matched module beside the frozen original;
* gradient checkpointing (non-reentrant, one decoder layer per checkpoint) keeps each layer's input and
  recomputes one layer at a time in the backward pass;
* the chunked loss keeps the gradient of the final hidden states from the forward pass and one chunk of
  float32 logits at a time; transformers' own loss keeps full-length float32 logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ctxext.errors import InputError

GIB = 2**30
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


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
            model_type=str(getattr(config, "model_type", "llama")),
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
        return sizes

    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token (projections and the output head)."""
        return self.linear_params() + self.vocab * self.hidden


@dataclass(frozen=True)
class Setup:
    """How one process trains: everything memory depends on besides the model's shape.

    Attributes:
        seq_len: tokens per sequence.
        micro_batch: sequences per forward pass.
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
    """

    seq_len: int
    micro_batch: int = 1
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
# backward pass through the layers, and the optimizer step. A component lives in some of them.
PHASES = ("loss", "backward", "step")


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


# Bytes per parameter of a quantized projection weight (bitsandbytes layouts).
def _quantized_bytes_per_param(mode: str, double_quant: bool) -> float:
    if mode == "nf4":
        # 4 bits + one absmax per 64-value block: fp32 (4 B / 64), or 8-bit with an fp32 constant per 256 blocks.
        return 0.5 + ((1 + 4 / 256) / 64 if double_quant else 4 / 64)
    if mode == "int8":
        return 1.0  # plus one fp32 scale per output row, added separately
    raise ValueError(mode)


def _matched(sizes: dict[str, int], suffixes: tuple[str, ...]) -> dict[str, int]:
    # peft's modules_to_save rule: a module whose path ends with a listed name.
    return {n: s for n, s in sizes.items() if any(n.endswith(x) for x in suffixes)}


def _optimizer_bytes(name: str, tensors: list[tuple[int, int]]) -> float:
    """Optimizer state of ``(numel, param bytes)`` tensors.

    AdamW keeps two states in the parameter's dtype; bitsandbytes' 8-bit AdamW two 8-bit states with an fp32
    absmax per 256-value block, except for tensors under 4096 values, which it keeps in fp32.
    """
    total = 0.0
    for n, nbytes in tensors:
        if name == "paged_adamw_8bit":
            total += n * 2 * ((1 + 4 / 256) if n >= 4096 else 4)
        else:
            total += n * 2 * nbytes
    return total


def weights(shape: ModelShape, s: Setup, fp: Footprint) -> None:
    """Frozen base weights: quantized projections, then the floating embeddings, head and norms."""
    n_lin = shape.linear_params()
    if s.quantized:
        per = _quantized_bytes_per_param(s.quantization, s.double_quant)
        size = n_lin * per
        if s.quantization == "int8":
            size += shape.layers * 4 * sum(o for _, o in shape.projection_dims().values())
        detail = f"{n_lin / 1e9:.2f}B params × {per:.3f} B ({s.quantization}, incl. quantization constants)"
    else:
        size = n_lin * s.compute_bytes
        detail = f"{n_lin / 1e9:.2f}B params × {s.compute_bytes} B"
    sharded = s.shards > 1 and not (s.sharding == "zero3" and s.quantized)
    if s.sharding == "zero3" and s.quantized:
        fp.notes.append("ZeRO-3 does not partition bitsandbytes weights: each GPU holds the whole quantized base")
    if sharded:
        size /= s.shards
        detail += f", sharded over {s.shards}"
    fp.add("weights", "decoder projections", size, detail)
    fb = s.frozen_float_bytes
    dtype = "fp32 (peft k-bit prep)" if s.quantized and s.compute_bytes != 4 else f"{fb} B"
    emb = shape.vocab * shape.hidden
    div = s.shards if sharded else 1
    fp.add("weights", "embed_tokens", emb * fb / div, f"{shape.vocab:,} × {shape.hidden:,} × {dtype}")
    if not shape.tied:
        fp.add("weights", "lm_head", emb * fb / div, f"{shape.vocab:,} × {shape.hidden:,} × {dtype}")
    fp.add("weights", "norms", (2 * shape.layers + 1) * shape.hidden * fb / div, f"{2 * shape.layers + 1} × {fb} B")
    if sharded:
        # FSDP / ZeRO-3 gather one layer for compute and prefetch the next.
        per_layer = n_lin / shape.layers * (per if s.quantized else s.compute_bytes)
        fp.add("weights", "gathered layers", 2 * per_layer, "2 decoder layers unsharded (current + prefetch)")


def trainable(shape: ModelShape, s: Setup, fp: Footprint) -> int:
    """LoRA and fully trained modules: parameters, gradients, optimizer states. Returns the parameter count."""
    dims = shape.projection_dims()
    fb = s.frozen_float_bytes
    # (numel, bytes per value) of every trainable tensor: LoRA A (r × in) and B (out × r), fp32 …
    tensors = [(s.lora_r * n, 4) for t in s.lora_targets if t in dims for n in dims[t] for _ in range(shape.layers)]
    n_lora = sum(n for n, _ in tensors)
    # … and the trainable copies of modules_to_save, in the frozen floating weights' dtype.
    extra = _matched(shape.module_sizes(), s.extra_trainable)
    tensors += [(n, fb) for n in extra.values()]
    n_extra = sum(extra.values())
    div = s.shards
    tail = f", sharded over {div}" if div > 1 else ""
    fp.add("trainable", "LoRA params", n_lora * 4 / div, f"{n_lora / 1e6:.1f}M × fp32 (r={s.lora_r}){tail}")
    names = sorted({n.rsplit(".", 1)[-1] for n in extra})
    fp.add(
        "trainable",
        "modules_to_save params",
        n_extra * fb / div,
        f"{n_extra / 1e6:.1f}M ({', '.join(names)}) trainable copies × {fb} B{tail}",
    )
    grads = (n_lora * 4 + n_extra * fb) / div
    fp.add("trainable", "gradients", grads, f"same dtype as the trainable params{tail}")
    if s.world > 1 and s.sharding == "none":
        fp.add("trainable", "DDP gradient buckets", grads, "DDP all-reduces a flat copy of the gradients")
    opt = _optimizer_bytes(s.optimizer, tensors) / div
    what = "2 fp32 states/param" if s.optimizer == "adamw" else "2 × 8-bit states/param + block constants (paged)"
    fp.add("trainable", f"optimizer ({s.optimizer})", opt, what + tail)
    # torch's single-tensor AdamW forms a few temporaries the size of the parameter it updates.
    largest = max((n * b for n, b in tensors), default=0) / div
    fp.add("trainable", "optimizer step temporaries", 2 * largest, "2 × the largest trainable tensor", ("step",))
    return n_lora + n_extra


FWD_BWD = ("loss", "backward")


def mlp_tokens(shape: ModelShape, s: Setup) -> int:
    """Tokens whose MLP intermediates exist at once: one shard with the tiled MLP, else all local tokens."""
    t = s.local_tokens
    if s.tiled_mlp is None:
        return t
    shards = min(t, s.tiled_mlp or -(-t // shape.hidden))
    return -(-t // shards)


def lora_saved_tensors(shape: ModelShape, s: Setup) -> list[int]:
    """Bytes of each tensor peft's LoRA layers save per decoder layer beyond the base model's tensors.

    peft casts a projection's input to the adapter's dtype (fp32) before ``lora_A``: with an fp32 residual stream
    and no dropout that is the input itself (already saved); with a bf16 stream each adapted projection keeps its
    own fp32 copy. With dropout (p > 0) each keeps the dropped fp32 copy and its boolean mask.
    """
    if s.lora_dropout <= 0 and s.residual == 4:
        return []
    per_value = [4, 1] if s.lora_dropout > 0 else [4]
    dims = shape.projection_dims()
    mlp = ("gate_proj", "up_proj", "down_proj")
    t, tm = s.local_tokens, mlp_tokens(shape, s)
    return [dims[p][0] * (tm if p in mlp else t) * b for p in s.lora_targets if p in dims for b in per_value]


def lora_saved_bytes(shape: ModelShape, s: Setup) -> float:
    """What peft's LoRA layers save per decoder layer beyond the base model's tensors (:func:`lora_saved_tensors`)."""
    return float(sum(lora_saved_tensors(shape, s)))


def layer_saved_tensors(shape: ModelShape, s: Setup) -> list[tuple[int, int]]:
    """(tensors, elements each) one decoder layer saves for the backward pass, for the local tokens.

    The LoRA/4-bit path with SDPA. Norms: the normalised value and the output (2 × hidden each); attention: q
    and k before RoPE, their rotated halves and the rotated result (3 × q, 3 × k), v, the attention output and
    its contiguous copy (2 × q); MLP: gate, SiLU(gate), up and their product (4 × intermediate; for one shard of
    tokens with the tiled MLP). 4-bit matmuls with frozen weights save nothing; LoRA's rank-r intermediates are
    negligible and left out.
    """
    t = s.local_tokens
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return [(4, t * shape.hidden), (5, t * q), (4, t * kv), (4, mlp_tokens(shape, s) * shape.intermediate)]


def attention_extra_bytes(shape: ModelShape, s: Setup, tokens: int) -> float:
    """Per-layer attention memory beyond q/k/v/output, by implementation, for ``tokens`` local tokens."""
    # Ulysses attends over the whole sequence with heads/N heads: the same log-sum-exp as T/N tokens × all heads.
    t = -(-s.seq_len // s.split)
    b = s.micro_batch
    if s.attention == "eager":
        # Scores (compute dtype), their float32 softmax and its cast back, per head: quadratic in T.
        return b * shape.heads * t * t * (2 * s.compute_bytes + 4)
    lse = b * shape.heads * t * 4  # the softmax log-sum-exp kept by flash / memory-efficient kernels
    if s.attention == "flash_attention_2" and s.residual == 4 and s.compute_bytes == 2:
        # transformers casts float32 q/k/v (peft's upcast residual stream) to bf16 for flash-attn.
        q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        return lse + tokens * (q + 2 * kv) * 2
    return lse


def layer_bytes(shape: ModelShape, s: Setup) -> float:
    """Bytes one decoder layer saves for the backward pass (its forward activations), for the local tokens."""
    saved = sum(n * e for n, e in layer_saved_tensors(shape, s)) * s.residual
    return saved + lora_saved_bytes(shape, s) + attention_extra_bytes(shape, s, s.local_tokens)


def heap_layer_bytes(shape: ModelShape, s: Setup, threshold: int) -> float:
    """The part of :func:`layer_bytes` that glibc's heap holds on to once freed (the CPU's malloc retention).

    glibc maps an allocation of ``threshold`` bytes or more on its own (returned when freed) unless a free chunk
    of its heap can serve it, and serves smaller ones from heap arenas that keep freed memory. When the
    residual-stream tensors (tokens × hidden, the most numerous) are under the threshold the heap grows to a
    forward pass and the larger tensors reuse its free chunks: the whole layer counts (measured: grown-code-64 at
    16k tokens, 45 MiB MLP tensors retained). When they are not, the heap stays small and only the tensors under
    the threshold count (measured: a hidden-2048 Llama at 8k tokens retains almost nothing).
    """
    t = s.local_tokens
    if t * shape.hidden * s.residual < threshold:
        return layer_bytes(shape, s)
    saved = sum(n * e * s.residual for n, e in layer_saved_tensors(shape, s) if e * s.residual < threshold)
    lora = sum(b for b in lora_saved_tensors(shape, s) if b < threshold)
    return saved + lora + attention_extra_bytes(shape, s, t)


def activations(shape: ModelShape, s: Setup, fp: Footprint) -> None:
    """Activations kept for the backward pass and the backward pass's working set."""
    t = s.local_tokens
    a = s.residual  # the residual stream's dtype (see the module docstring)
    layer = layer_bytes(shape, s)
    # Backward of one layer beyond its saved tensors: the residual-stream gradient it receives. The gradients it
    # forms inside the layer (the MLP's intermediates included) replace saved tensors of the same size, which
    # autograd frees once their node has run: the forced-mmap runs (live peaks, docs/planning.md) measured no
    # more than that, and the earlier 2·t·H + 3·t·I working set put every checkpointed live peak 15–45 % high.
    working = a * t * shape.hidden
    per_tok = f"{t:,} tokens × {a} B"
    checkpoints = shape.layers * t * shape.hidden * a
    if s.checkpointing and s.offload_checkpoints:
        # save_on_cpu copies each layer input to pinned host memory in the forward pass and back, one layer at a
        # time, when the backward pass recomputes that layer.
        fp.add("activations", "offloaded checkpoint in flight", t * shape.hidden * a, "one layer input", FWD_BWD)
        fp.notes.append(
            f"checkpoints offloaded: {checkpoints / GIB:.1f} GiB of pinned host memory per GPU, "
            f"{2 * checkpoints / GIB:.1f} GiB over PCIe per micro-batch (device→host, then host→device)"
        )
    elif s.checkpointing:
        fp.add(
            "activations",
            "layer inputs (checkpoints)",
            checkpoints,
            f"{shape.layers} layers × {per_tok} × hidden {shape.hidden}",
            FWD_BWD,
        )
    if s.checkpointing:
        how = f"one layer's saved tensors, {s.attention}" + (", MLP tiled" if s.tiled_mlp is not None else "")
        fp.add("activations", "recomputed layer", layer, how, ("backward",))
    else:
        fp.add(
            "activations",
            "all layers' saved tensors",
            shape.layers * layer,
            f"{shape.layers} layers, {s.attention}",
            FWD_BWD,
        )
    fp.add("activations", "backward working set", working, "the residual gradient the layer receives", ("backward",))
    if s.quantized:
        # bitsandbytes dequantizes one projection at a time to the compute dtype for its matmul.
        largest = max(a_ * b_ for a_, b_ in shape.projection_dims().values())
        fp.add("activations", "dequantized projection", largest * s.compute_bytes, "transient, one at a time", FWD_BWD)
    fp.add("activations", "final norm + hidden states", 3 * t * shape.hidden * a, "final norm's saved tensors", FWD_BWD)
    if s.row_mask and s.attention != "flash_attention_2" and s.sequence_parallel == 1:
        # Rows with segments (document mask, short rows, task rows) reach SDPA as a (B, 1, T, T) bool mask, which
        # SDPA turns into an additive mask in the activations' dtype: quadratic in T. Under the Ulysses split no
        # mask is built: each document is attended on its own (training/sequence_parallel.py).
        mask = s.micro_batch * -(-s.seq_len // s.context_parallel) * s.seq_len * (1 + a)
        fp.add("activations", "T×T attention mask (rows with segments)", mask, f"bool + a {a}-byte copy", FWD_BWD)


def all_to_all_elems(shape: ModelShape, s: Setup) -> int:
    """Elements one process sends per attention layer and pass under Ulysses (q, k, v in; the output back).

    Each process keeps 1/N of what it exchanges; the rest crosses the link. 0 without the split.
    """
    if s.sequence_parallel == 1:
        return 0
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return s.local_tokens * (2 * q + 2 * kv) * (s.sequence_parallel - 1) // s.sequence_parallel


def all_to_all_bytes(shape: ModelShape, s: Setup) -> int:
    """Bytes one process sends per micro-batch: every layer, forward and backward (and the recomputed forward)."""
    passes = 3 if s.checkpointing else 2
    return shape.layers * passes * all_to_all_elems(shape, s) * s.residual


def all_to_all(shape: ModelShape, s: Setup, fp: Footprint) -> None:
    """Ulysses' exchange buffers: the one tensor class the split does not divide by N (it reshapes, not shrinks).

    Per layer, the gathered q, k, v and the attention output (whole sequence, heads/N: as many elements as the
    local tokens × all heads) are kept for the backward pass, and one layer's set is in flight. What is sent is the
    projections' own output (already counted in the layer's saved tensors), so only what is received is new.
    """
    if s.sequence_parallel == 1:
        return
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    per_layer = s.local_tokens * (2 * q + 2 * kv) * s.residual  # q/k/v/out in the residual stream's dtype
    kept = 1 if s.checkpointing else shape.layers
    fp.all_to_all = all_to_all_bytes(shape, s)
    fp.add(
        "activations",
        "Ulysses all-to-all buffers",
        kept * per_layer,
        f"gathered q/k/v/out of {kept} layer(s), heads/{s.sequence_parallel}",
        FWD_BWD,
    )


def loss(shape: ModelShape, s: Setup, fp: Footprint) -> None:
    """The loss: ctxext's chunked cross-entropy, or full-length float32 logits."""
    t = s.local_tokens
    v = shape.vocab
    head_bytes = s.frozen_float_bytes
    if s.loss == "chunked":
        c = min(s.loss_chunk, t)
        grad_h = t * shape.hidden * s.residual
        fp.add("loss", "grad of hidden states", grad_h, "formed in the forward pass", ("loss",))
        upcast = c * v * head_bytes if head_bytes != 4 else 0
        chunk = c * v * 4 + upcast + c * shape.hidden * 4
        fp.add("loss", f"one chunk of logits ({c} tokens)", chunk, "fp32", ("loss",))
    else:
        # Backward of cross-entropy: the saved log-softmax, the gradient from nll_loss and the gradient of the
        # logits exist together (3 float32 copies; measured 3.0 in isolation on this CPU); bf16 logits add one.
        copies = 3 + (0.5 if head_bytes == 2 else 0)
        fp.add(
            "loss",
            "full logits: log-softmax + 2 grads",
            t * v * 4 * copies,
            f"{t:,} × {v:,} × fp32 × {copies:g}",
            ("loss",),
        )


def footprint(shape: ModelShape, s: Setup) -> Footprint:
    """The per-process memory of a training step, before runtime overheads (added by the planner)."""
    fp = Footprint()
    weights(shape, s, fp)
    trainable(shape, s, fp)
    activations(shape, s, fp)
    all_to_all(shape, s, fp)
    loss(shape, s, fp)
    return fp
