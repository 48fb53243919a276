"""Training memory of one process, by component, from a model's config and a training setup (no weights).

The formulas follow what ctxext's training path does (``ctxext/training/model.py``, ``ctxext/training/run.py``,
``ctxext/training/losses.py``), written out per component in ``docs/memory-model.md``:

* the model state (frozen base, adapters or every weight trained, gradients, optimizer): :mod:`.state`;
* what one decoder layer saves for its backward pass, tensor by tensor, measured with autograd's saved-tensor
  hooks (:mod:`.layer`);
* gradient checkpointing (non-reentrant, one decoder layer per checkpoint) keeps each layer's input and
  recomputes one layer at a time in the backward pass; the peak of a layer's backward is either at its start
  (all its saved tensors) or inside its attention kernel's backward (the MLP half freed, the kernel's gradients
  and buffers added);
* the chunked loss keeps the gradient of the final hidden states from the forward pass and one chunk of
  float32 logits at a time; transformers' own loss keeps full-length float32 logits.
"""

from __future__ import annotations

from ctxext.planner.layer import (
    ATTENTION,
    attention_backward,
    kernel_view,
    layer_input_saved,
    layer_saved,
    mlp_tokens,
)
from ctxext.planner.setup import (
    BACKWARD,
    FWD_BWD,
    GIB,
    PHASES,
    PROJECTIONS,
    QK_NORM,
    Component,
    Footprint,
    ModelShape,
    Setup,
)
from ctxext.planner.state import full_state, trainable, weights

__all__ = [
    "BACKWARD",
    "FWD_BWD",
    "GIB",
    "PHASES",
    "PROJECTIONS",
    "QK_NORM",
    "Component",
    "Footprint",
    "ModelShape",
    "Setup",
    "footprint",
    "layer_bytes",
    "mlp_tokens",
]


def layer_bytes(shape: ModelShape, s: Setup) -> float:
    """Bytes one decoder layer saves for the backward pass (its forward activations), for the local tokens."""
    return float(sum(x.bytes for x in layer_saved(shape, s)))


def heap_layer_bytes(shape: ModelShape, s: Setup, threshold: int) -> float:
    """The part of :func:`layer_bytes` that glibc's heap holds on to once freed (the CPU's malloc retention).

    glibc maps an allocation of ``threshold`` bytes or more on its own (returned when freed) unless a free chunk
    of its heap can serve it, and serves smaller ones from heap arenas that keep freed memory. When the
    residual-stream tensors (tokens × hidden, the most numerous) are under the threshold the heap grows to a
    forward pass and the larger tensors reuse its free chunks: the whole layer counts (measured: grown-code-64 at
    16k tokens, 45 MiB MLP tensors retained). When they are not, the heap stays small and only the tensors under
    the threshold count (measured: a hidden-2048 Llama at 8k tokens retains almost nothing).
    """
    if s.local_tokens * shape.hidden * s.residual < threshold:
        return layer_bytes(shape, s)
    return float(sum(x.bytes for x in layer_saved(shape, s) if x.bytes < threshold))


def _layers(shape: ModelShape, s: Setup, fp: Footprint) -> None:
    """The saved tensors of the recomputed layer (or of every layer), and the attention backward's extras."""
    saved = layer_saved(shape, s)
    layer = sum(x.bytes for x in saved)
    upto = sum(x.bytes for x in saved if x.stage == ATTENTION)
    kernel = [b for _, b in attention_backward(shape, s)]
    tiled = ", MLP tiled" if s.tiled_mlp is not None else ""
    if s.checkpointing:
        fp.add(
            "activations",
            "recomputed layer",
            layer,
            f"its saved tensors (autograd hooks), {s.attention}{tiled}",
            ("backward",),
        )
        fp.add(
            "activations",
            "recomputed layer up to its attention",
            upto,
            "what is still saved when the attention's backward runs",
            ("attention backward",),
        )
    else:
        per = layer + layer_input_saved(shape, s)
        fp.add("activations", "all layers' saved tensors", shape.layers * per, f"{shape.layers} layers", FWD_BWD)
    # In the MLP's backward the gradient of SiLU(gate) × up is formed from down_proj's two paths (the frozen
    # weight's and LoRA's, or the weight's) before the saved intermediates are freed: one more intermediate-sized
    # tensor at the start of a layer's backward (measured with the CPU memory profiler: +1.0 × t·I·4 over the
    # saved tensors for grown-code-64 at 2k and 8k tokens).
    fp.add(
        "activations",
        "MLP backward: gradient of the intermediate",
        mlp_tokens(shape, s) * shape.intermediate * s.residual,
        "formed before the saved intermediates are freed",
        ("backward",),
    )
    fp.add(
        "activations",
        "attention backward: dO, dQ, dK, dV",
        sum(kernel),
        "the output's gradient and the kernel's results",
        ("attention backward",),
    )


def activations(shape: ModelShape, s: Setup, fp: Footprint) -> None:
    """Activations kept for the backward pass and the backward pass's working set."""
    t = s.local_tokens
    a = s.residual  # the residual stream's dtype
    # Backward of one layer beyond its saved tensors: the residual-stream gradient it receives. The gradients it
    # forms inside the layer (the MLP's intermediates included) replace saved tensors of the same size, which
    # autograd frees once their node has run: the forced-mmap runs (live peaks, docs/results-planning.md) measured no
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
    _layers(shape, s, fp)
    fp.add("activations", "backward working set", working, "the residual gradient the layer receives", BACKWARD)
    if s.quantized:
        # bitsandbytes dequantizes one projection at a time to the compute dtype for its matmul.
        largest = max(a_ * b_ for a_, b_ in shape.projection_dims().values())
        fp.add("activations", "dequantized projection", largest * s.compute_bytes, "transient, one at a time", FWD_BWD)
    fp.add("activations", "final norm + hidden states", 3 * t * shape.hidden * a, "final norm's saved tensors", FWD_BWD)
    if s.row_mask and s.attention == "sdpa" and s.sequence_parallel == 1:
        # Rows with segments (document mask, short rows, task rows) reach SDPA as a (B, 1, T, T) bool mask, built
        # once per forward (each layer's additive copy is among its saved tensors). Under the Ulysses split no
        # mask is built: each document is attended on its own (training/sequence_parallel.py).
        mask = s.micro_batch * -(-s.seq_len // s.context_parallel) * s.seq_len
        fp.add("activations", "T×T attention mask (rows with segments)", mask, "bool", FWD_BWD)


def all_to_all_elems(shape: ModelShape, s: Setup) -> int:
    """Elements one process sends per attention layer and pass under Ulysses (q, k, v in; the output back).

    Each process keeps 1/N of what it exchanges; the rest crosses the link. Replicated key/value heads are sent
    as often as they are repeated. 0 without the split.
    """
    if s.sequence_parallel == 1:
        return 0
    rows, seq, q_heads, kv_heads = kernel_view(shape, s)
    per_rank = rows * seq * shape.head_dim * (2 * q_heads + 2 * kv_heads)  # gathered q, k, v, out on one rank
    return per_rank * (s.sequence_parallel - 1) // s.sequence_parallel


def all_to_all_bytes(shape: ModelShape, s: Setup) -> int:
    """Bytes one process sends per micro-batch: every layer, forward and backward (and the recomputed forward)."""
    passes = 3 if s.checkpointing else 2
    return shape.layers * passes * all_to_all_elems(shape, s) * s.residual


def all_to_all(shape: ModelShape, s: Setup, fp: Footprint) -> None:
    """Ulysses' exchange buffers in flight: one layer's contiguous send copies and receive buffers.

    What the exchange leaves for the backward pass (the gathered q, k, v and output) is among the layer's saved
    tensors; what is in flight while one layer exchanges is a send and a receive buffer of q, k and v (modelled
    from DeepSpeed's ``UlyssesSPAttentionHF``, not measured). They count in the forward pass; in the backward
    the exchanges come before the attention kernel (the gathered dO, counted there) and after it (dQ, dK, dV
    swapped back once q, k, v and the kernel's buffers are freed), at neither of the backward's two peaks.
    """
    if s.sequence_parallel == 1:
        return
    rows, seq, q_heads, kv_heads = kernel_view(shape, s)
    per_layer = 2 * rows * seq * shape.head_dim * (q_heads + 2 * kv_heads) * s.residual
    fp.all_to_all = all_to_all_bytes(shape, s)
    fp.add(
        "activations",
        "Ulysses all-to-all buffers in flight",
        per_layer,
        f"send + receive copies of one layer's q/k/v, heads/{s.sequence_parallel}",
        ("loss",),
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
    if s.finetune == "full":
        full_state(shape, s, fp)
    else:
        weights(shape, s, fp)
        trainable(shape, s, fp)
    activations(shape, s, fp)
    all_to_all(shape, s, fp)
    loss(shape, s, fp)
    return fp
