"""Model state of one process: the frozen base, the trained parameters, their gradients and optimizer states.

Two kinds of fine-tuning: adapters (LoRA / QLoRA: a frozen, possibly 4-bit base, fp32 adapters and
``modules_to_save`` copies, as peft builds them) and full fine-tuning (every weight trained with AdamW in mixed
precision, sharded over the processes by FSDP2 or ZeRO-3; optimizer states in host memory where configured).
"""

from __future__ import annotations

from ctxext.planner.setup import BACKWARD, Footprint, ModelShape, Setup


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
    norms = shape.norm_params()
    fp.add("weights", "norms", norms * fb / div, f"{norms:,} values × {fb} B")
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


def _full_bytes(s: Setup) -> dict[str, tuple[float, str]]:
    """Bytes per parameter of each piece of a full fine-tune's state, and how it is held (before sharding).

    Mixed-precision AdamW keeps fp32 master weights and two fp32 moments. FSDP2 (accelerate's ``mixed_precision:
    bf16``) shards the fp32 parameters themselves — they are the master weights — and reduces gradients in fp32;
    ZeRO-3 partitions bf16 weights and bf16 gradients and keeps the fp32 master partition in its optimizer. One
    process without sharding (or DDP) trains fp32 parameters under autocast. 8-bit AdamW keeps 8-bit moments.
    """
    moments = 2 * (1 + 4 / 256) if s.optimizer == "paged_adamw_8bit" else 8.0
    adam = (moments, "2 × 8-bit moments + block constants" if moments < 8 else "AdamW m and v, fp32")
    if s.sharding == "zero3":
        return {
            "bf16 weights": (2.0, "bf16 partitions"),
            "fp32 master weights": (4.0, "the optimizer's fp32 copy"),
            "gradients": (2.0, "bf16 partitions"),
            "optimizer moments": adam,
        }
    weight = 4.0 if s.compute_bytes == 2 else float(s.compute_bytes)
    return {
        "weights (fp32 master)": (weight, "fp32 parameters, cast to bf16 per layer for compute"),
        "gradients": (weight, "fp32 (reduced in fp32)"),
        "optimizer moments": adam,
    }


def full_state(shape: ModelShape, s: Setup, fp: Footprint) -> int:
    """Every weight trained: weights, master weights, gradients, AdamW moments, and what sharding gathers.

    Returns the trained parameter count.
    """
    n = shape.params()
    div = s.shards
    tail = f", sharded over {div}" if div > 1 else ""
    host = {"optimizer moments", "fp32 master weights"} if s.offload_optimizer else set()
    if s.offload_optimizer and s.sharding == "fsdp2":
        host = {"weights (fp32 master)", "gradients", "optimizer moments"}  # FSDP2's CPUOffloadPolicy: all of it
    moved = 0.0
    for name, (per, how) in _full_bytes(s).items():
        if name in host:
            moved += n * per / div
            continue
        group = "weights" if "weights" in name else "trainable"
        fp.add(group, name, n * per / div, f"{n / 1e9:.2f}B params × {per:g} B ({how}){tail}")
    if moved:
        fp.notes.append(
            f"optimizer offload: {moved / 2**30:.1f} GiB of optimizer state per process in host memory "
            f"({', '.join(sorted(host))}); the step runs on the CPU"
        )
    if s.world > 1 and s.sharding == "none":
        fp.add("trainable", "DDP gradient buckets", n * 4, "DDP all-reduces a flat copy of the gradients")
    per_layer = shape.linear_params() // shape.layers + 2 * shape.hidden
    if div > 1:
        # FSDP / ZeRO-3 gather one layer for compute and prefetch the next, in bf16; a layer's gradients exist
        # unsharded until they are reduce-scattered; the embeddings and head are gathered whole.
        fp.add("weights", "gathered layers", 2 * per_layer * s.compute_bytes, "2 decoder layers unsharded (bf16)")
        grad = _full_bytes(s)["gradients"][0]
        fp.add("trainable", "unsharded gradients of one layer", per_layer * grad, "before reduce-scatter", BACKWARD)
        head = shape.vocab * shape.hidden
        fp.add(
            "weights",
            "gathered lm_head + its gradient",
            head * (s.compute_bytes + grad),
            "the output head unsharded for the loss",
            ("loss",),
        )
    if not s.offload_optimizer:
        # torch's foreach AdamW (the default on CUDA under FSDP2) forms one fp32 temporary per state tensor.
        temp = n * 4 / div if s.sharding != "zero3" else 0
        fp.add("trainable", "optimizer step temporaries", temp, "foreach AdamW: one fp32 copy of the states", ("step",))
    return n
