"""What one decoder layer saves for its backward pass, tensor by tensor, and what its attention backward adds.

The rules below were read off ``torch.autograd.graph.saved_tensors_hooks`` on one decoder layer of tiny Llama and
Qwen3 models through ctxext's training path (nf4 + LoRA with and without the bf16 stream, LoRA dropout, norms
trained or frozen, full fine-tuning in bf16 and fp32, SDPA); ``tests/unit/planner/test_plan_layer.py`` re-measures
them and asserts byte equality. Per token of a layer (``a`` bytes of the residual stream, widths H, q, kv, I):

* **RMSNorm** keeps an fp32 copy of its input (``x.to(float32)``: the input itself when the stream is fp32,
  then already counted as the layer's checkpoint for the input norm), the reciprocal RMS (4 B per row) and, when
  its weight is trained, the normalised value in the stream's dtype.
* **Projections** keep their input when their weight is trained (full fine-tuning; q/k/v and gate/up share
  one). A 4-bit or frozen weight keeps nothing; peft's LoRA keeps its input cast to fp32 (the input itself on an
  fp32 stream, shared; a copy per adapted projection on a bf16 stream), the rank-r output of ``lora_A`` (fp32),
  and with dropout the dropped fp32 copy and its boolean mask instead.
* **Attention (SDPA)** keeps the rotated q and k, v, the output and the fp32 log-sum-exp: 2q + 2kv values per
  token, not the un-rotated projections (RoPE's products keep only cos/sin, shared by every layer). o_proj's input
  is the attention output itself. Qwen3's q/k norms are RMSNorms over each head.
* **Gated MLP** keeps gate, SiLU(gate) and up (3I) and, for down_proj, its input as the projections do.

Under the Ulysses split (DeepSpeed's ``UlyssesSPAttentionHF``) SDPA keeps the gathered tensors (whole sequence,
heads/N: as many values as the local tokens × all heads) and o_proj's input is the output swapped back, a new
tensor. When N does not divide the key/value heads each rank holds the key/value heads its query heads need
(replicated: DeepSpeed repeats them before the exchange), so the gathered k and v are larger. These are modelled
from DeepSpeed's code, not measured here (one process cannot run the exchange).
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxext.planner.setup import ModelShape, Setup

# Stages of a layer's forward pass, in order. In the backward pass the MLP half and o_proj are undone before the
# attention kernel's backward runs, so their tensors are already freed then (autograd frees each node's saved
# tensors once it has run); the attention stage and what comes before it are still alive.
ATTENTION, AFTER = "attention", "after attention"


@dataclass(frozen=True)
class Saved:
    """One tensor (or one kind of tensor) a decoder layer saves for the backward pass.

    Attributes:
        what: what it is.
        bytes: its size for the layer's local tokens.
        stage: :data:`ATTENTION` (alive in the attention kernel's backward) or :data:`AFTER`.
    """

    what: str
    bytes: int
    stage: str = ATTENTION


def kv_heads_per_rank(shape: ModelShape, sp: int) -> int:
    """Key/value heads one rank holds under a Ulysses split of ``sp``: the most any rank's query heads read.

    The ranges are training's own (:func:`ctxext.recipe.parallel.ulysses_plan`): a split dividing the key/value
    heads gives each rank ``kv/sp``; a wider or uneven one repeats heads where a rank's query heads need them.
    """
    from ctxext.recipe.parallel import ulysses_plan

    if sp == 1:
        return shape.kv_heads
    plan = ulysses_plan(shape.heads, shape.kv_heads, sp)
    if isinstance(plan, str):  # refused by the plan's head check before any term is computed
        raise ValueError(plan)
    return max(hi - lo for lo, hi in plan.kv)


def replicated_kv(shape: ModelShape, s: Setup) -> int:
    """Key/value heads added by replication under the split (0 when the split divides them)."""
    from ctxext.recipe.parallel import ulysses_plan

    plan = ulysses_plan(shape.heads, shape.kv_heads, s.sequence_parallel)
    return 0 if isinstance(plan, str) else plan.replicated_kv


def _trained(s: Setup, module: str) -> bool:
    """Whether a module's weight is trained: everything in a full fine-tune, ``modules_to_save`` otherwise."""
    return s.finetune == "full" or any(module.endswith(x) for x in s.extra_trainable)


def attention_dtype(s: Setup) -> int:
    """Bytes per value of what the attention kernel keeps (flash-attn gets bf16 casts of an fp32 stream)."""
    if s.attention == "flash_attention_2" and s.residual == 4 and s.compute_bytes == 2:
        return 2
    return s.residual


def _norm(s: Setup, what: str, width: int, rows: int, tokens: int, fresh: bool, module: str) -> list[Saved]:
    """An RMSNorm over ``width`` values in ``rows`` rows per token (``fresh``: its input is not a checkpoint)."""
    out = []
    if fresh or s.residual != 4:
        copy = "its input" if s.residual == 4 else "an fp32 copy of its input"
        out.append(Saved(f"{what}: {copy}", 4 * width * tokens))
    out.append(Saved(f"{what}: reciprocal RMS", 4 * rows * tokens))
    if _trained(s, module):
        out.append(Saved(f"{what}: normalised value (weight trained)", s.residual * width * tokens))
    return out


def _inputs(
    s: Setup, what: str, projections: tuple[str, ...], width: int, tokens: int, dtype: int, fresh: bool = True
) -> list[Saved]:
    """What the projections reading one tensor (``width`` values of ``dtype`` bytes per token) keep of it.

    ``fresh``: nothing else keeps the tensor itself (when something does, e.g. a checkpoint, it is not counted
    again).
    """
    keep_itself = [Saved(what, dtype * width * tokens)] if fresh else []
    if s.finetune == "full":
        return keep_itself
    adapted = [p for p in projections if p in s.lora_targets]
    out = []
    for p in adapted:
        if s.lora_dropout > 0:
            # CUDA's fused dropout keeps a bool mask; the CPU's keeps its scaled noise in the input's dtype (fp32).
            mask = 1 if s.cuda else 4
            out.append(Saved(f"{p} LoRA: dropped fp32 input + mask", (4 + mask) * width * tokens))
        elif dtype != 4:
            out.append(Saved(f"{p} LoRA: fp32 copy of its input", 4 * width * tokens))
    if adapted and s.lora_dropout <= 0 and dtype == 4:
        out += keep_itself
    out += [Saved(f"{p} LoRA: lora_A output (r={s.lora_r})", 4 * s.lora_r * tokens) for p in adapted]
    return out


def kernel_view(shape: ModelShape, s: Setup) -> tuple[int, int, int, int]:
    """(rows, sequence, query heads, key/value heads) the attention kernel of one process sees.

    Under Ulysses the whole (padded) sequence with ``ceil(heads/N)`` query heads and the key/value heads they
    need; otherwise this process's tokens with every head.
    """
    sp = s.sequence_parallel
    if sp > 1:
        return s.micro_batch, -(-s.seq_len // sp) * sp, -(-shape.heads // sp), kv_heads_per_rank(shape, sp)
    return s.micro_batch, -(-s.seq_len // s.context_parallel), shape.heads, shape.kv_heads


def _attention(shape: ModelShape, s: Setup, t: int) -> list[Saved]:
    a, d = s.residual, shape.head_dim
    q, kv = shape.heads * d, shape.kv_heads * d
    out = _norm(s, "input norm", shape.hidden, 1, t, False, "input_layernorm")
    out += _inputs(s, "input norm output", ("q_proj", "k_proj", "v_proj"), shape.hidden, t, a)
    if shape.qk_norm:
        out += _norm(s, "q norm", q, shape.heads, t, True, "q_norm")
        out += _norm(s, "k norm", kv, shape.kv_heads, t, True, "k_norm")
    rows, seq, q_heads, kv_heads = kernel_view(shape, s)
    c, n = attention_dtype(s), rows * seq
    if s.attention == "eager":
        # Eager repeats k/v to every query head, keeps the fp32 softmax (and its cast to a bf16 copy for the
        # product with v): quadratic in the sequence; its output is a new tensor, kept by o_proj.
        probs = rows * q_heads * seq * seq * (4 + (c if c != 4 else 0))
        return out + [
            Saved("attention: rotated q", c * n * q_heads * shape.head_dim),
            Saved("attention: k repeated to every query head", c * n * q_heads * shape.head_dim),
            Saved("attention: v repeated to every query head", c * n * q_heads * shape.head_dim),
            Saved("attention: softmax probabilities (eager, quadratic)", probs),
        ]
    if s.row_mask and s.sequence_parallel == 1 and s.attention == "sdpa":
        # Rows with segments reach SDPA with a T×T bool mask: transformers then repeats k/v for SDPA instead of
        # passing enable_gqa, and SDPA keeps the mask converted to an additive one in the activations' dtype.
        kv_heads = q_heads
        out.append(Saved("attention: T×T additive mask", rows * seq * seq * c))
    where = f", gathered (heads/{s.sequence_parallel})" if s.sequence_parallel > 1 else ""
    return out + [
        Saved(f"attention: rotated q{where}", c * n * q_heads * d),
        Saved(f"attention: rotated k{where}", c * n * kv_heads * d),
        Saved(f"attention: v{where}", c * n * kv_heads * d),
        Saved(f"attention: output{where}", c * n * q_heads * d),
        Saved("attention: log-sum-exp (fp32)", 4 * n * q_heads),
    ]


def _after_attention(shape: ModelShape, s: Setup, t: int, m: int) -> list[Saved]:
    a, h, i = s.residual, shape.hidden, shape.intermediate
    q = shape.heads * shape.head_dim
    # o_proj reads the attention output: the kernel's own saved tensor, except under Ulysses (swapped back) and
    # with eager attention (a transposed copy), where it is a new one.
    fresh = s.sequence_parallel > 1 or s.attention == "eager"
    what = "attention output" + (", swapped back" if s.sequence_parallel > 1 else "")
    out = _inputs(s, what, ("o_proj",), q, t, attention_dtype(s), fresh)
    out += _norm(s, "post-attention norm", h, 1, t, True, "post_attention_layernorm")
    if s.tiled_mlp is not None:
        # The shards' checkpoints hold views of the whole post-attention norm output (their inputs).
        out.append(Saved("post-attention norm output (held by the MLP shards)", a * h * t))
        out += _inputs(s, "", ("gate_proj", "up_proj"), h, m, a, fresh=False)
    else:
        out += _inputs(s, "post-attention norm output", ("gate_proj", "up_proj"), h, m, a)
    out += [
        Saved("MLP: gate", a * i * m),
        Saved("MLP: SiLU(gate)", a * i * m),
        Saved("MLP: up", a * i * m),
    ]
    out += _inputs(s, "MLP: SiLU(gate) × up", ("down_proj",), i, m, a)
    return [Saved(x.what, x.bytes, AFTER) for x in out]


def mlp_tokens(shape: ModelShape, s: Setup) -> int:
    """Tokens whose MLP intermediates exist at once: one shard with the tiled MLP, else all local tokens."""
    t = s.local_tokens
    if s.tiled_mlp is None:
        return t
    shards = min(t, s.tiled_mlp or -(-t // shape.hidden))
    return -(-t // shards)


def layer_saved(shape: ModelShape, s: Setup) -> list[Saved]:
    """Every tensor one decoder layer saves for the backward pass, for this process's tokens.

    The layer's input is not counted: with checkpointing it is the checkpoint (its own line in the plan), without
    it the plan adds it per layer (:func:`layer_input_saved`). The MLP's tensors are for one shard of tokens with
    the tiled MLP.
    """
    t, m = s.local_tokens, mlp_tokens(shape, s)
    return [x for x in _attention(shape, s, t) + _after_attention(shape, s, t, m) if x.bytes > 0]


def layer_input_saved(shape: ModelShape, s: Setup) -> int:
    """Bytes of a layer's input kept by its input norm without checkpointing (an fp32 stream keeps it as it is)."""
    return 4 * shape.hidden * s.local_tokens if s.residual == 4 else 0


def attention_backward(shape: ModelShape, s: Setup) -> list[tuple[str, int]]:
    """What exists in the attention kernel's backward beyond the saved tensors, on every device.

    The gradient of the attention output arrives (dO), and the kernel returns dQ, dK, dV while q, k, v, the output
    and the log-sum-exp are still saved (they are freed when the node has run).
    """
    rows, seq, q_heads, kv_heads = kernel_view(shape, s)
    values, c = rows * seq * shape.head_dim, attention_dtype(s)
    return [
        ("gradient of the attention output (dO)", c * values * q_heads),
        ("dQ, dK, dV", c * values * (q_heads + 2 * kv_heads)),
    ]


def flash_backward_buffers(shape: ModelShape, s: Setup) -> list[tuple[str, int]]:
    """The CUDA flash-attention backward's own buffers (flash-attn 2 ``mha_bwd``; torch's SDPA flash is the same).

    An fp32 dQ accumulator over the sequence rounded up to 128 and head_dim rounded up to 32, an fp32 row term
    (``softmax_d``), and with fewer key/value heads than query heads dK and dV expanded to every query head before
    they are summed back. Read from the source, not measured here; ``scripts/gpu_check.py`` measures it.
    """
    if s.attention == "eager":
        return []
    rows, seq, q_heads, kv_heads = kernel_view(shape, s)
    padded, dim = -(-seq // 128) * 128, -(-shape.head_dim // 32) * 32
    out = [
        ("fp32 dQ accumulator", 4 * rows * padded * q_heads * dim),
        ("fp32 softmax_d", 4 * rows * padded * q_heads),
    ]
    if kv_heads < q_heads:
        out.append(
            ("dK, dV expanded to every query head", 2 * attention_dtype(s) * rows * seq * q_heads * shape.head_dim)
        )
    return out


def replication_bytes(shape: ModelShape, s: Setup) -> int:
    """Bytes per rank and layer that replicated key/value heads add to what the attention keeps and returns.

    Each rank's useful share is kv/N heads; it holds :func:`kv_heads_per_rank` of them (the gathered k and v, and
    in the backward dK and dV).
    """
    if replicated_kv(shape, s) <= 0:
        return 0
    rows, seq, _, kv_heads = kernel_view(shape, s)
    share = shape.kv_heads / s.sequence_parallel
    return int(2 * 2 * attention_dtype(s) * rows * seq * shape.head_dim * (kv_heads - share))


def cpu_attention_backward_buffers(shape: ModelShape, s: Setup) -> int:
    """The CPU SDPA (flash) backward's own buffers beyond dQ, dK and dV: t·q·(4 + c/2) bytes.

    Fitted to the CPU memory profiler's live peak of an isolated SDPA backward (4 shapes, fp32 and bf16, GQA and
    not: 1.25–1.5 × t·q·c over the gradients in fp32, 1.75–2.5 × in bf16; per-thread blocks make small shapes
    larger), what an fp32 dQ accumulator plus half a q-sized copy gives.
    """
    if s.attention != "sdpa":
        return 0
    rows, seq, q_heads, _ = kernel_view(shape, s)
    c = attention_dtype(s)
    return int(rows * seq * q_heads * shape.head_dim * (4 + c / 2))
