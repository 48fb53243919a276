"""Whether a training step fits a device: the footprint plus the device's runtime terms, and the longest length.

:func:`device_footprint` adds to :func:`ctxext.planner.footprint.footprint` what the device itself holds
(the CUDA context, flash-attention's backward buffers and allocator fragmentation, or the CPU's Python + torch
runtime and malloc retention); a plan fits when the upper end of its error band (:mod:`ctxext.planner.band`) is
within the device's capacity less :data:`HEADROOM`.
"""

from __future__ import annotations

import dataclasses

from ctxext.models.devices import GIB, Device
from ctxext.planner.band import band_of
from ctxext.planner.footprint import FWD_BWD, PHASES, Footprint, ModelShape, Setup, footprint, heap_layer_bytes
from ctxext.planner.layer import cpu_attention_backward_buffers, flash_backward_buffers

# CUDA: the context, cuBLAS/cuDNN workspaces and NCCL buffers live outside PyTorch's allocator; the caching
# allocator holds more than it hands out (fragmentation). Not calibrated here (no GPU): typical values.
CUDA_CONTEXT = 1.0 * GIB
CUDA_FRAGMENTATION = 0.10
# With expandable segments the allocator maps more memory into one segment instead of opening a new one for a
# size that does not fit a free block, which removes most of that waste. Assumed, not measured (no GPU here).
CUDA_FRAGMENTATION_EXPANDABLE = 0.03
# CPU (peak resident memory, what `ctxext train` reports there): the resident memory of Python + torch +
# transformers + peft + bitsandbytes with a model loaded and one warm-up step taken, less the model itself —
# fitted as the mean over the benchmark cells of benchmarks/plan_accuracy.py (its "warm" column). And glibc
# malloc's retention: activation tensors under its mmap threshold live in heap arenas that are not given back
# when freed, so the resident peak holds, beside the live tensors, about one forward pass's worth of those
# activations (all layers' saved tensors) even with checkpointing. Tensors of 32 MiB or more (glibc's dynamic
# threshold never rises above DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB on 64-bit) are mapped on their own and returned
# when freed unless the heap has grown: see footprint.heap_layer_bytes. A hidden-2048 model at 8k tokens keeps
# almost nothing back, the same model at 2k tokens keeps its whole forward pass. docs/results-planning.md compares the
# activation formulas with runs where mmap is forced (the live peak) and this term with glibc's real retention.
CPU_RUNTIME = 553 * 2**20
MMAP_THRESHOLD_MAX = 32 * 2**20
# Memory held back from the device's capacity before a plan "fits": what the formulas do not count (CUDA
# graphs, NCCL buffers growing, a longer-than-usual document mask). The formulas' own error is the band's.
HEADROOM = 0.05


def device_footprint(shape: ModelShape, setup: Setup, device: Device) -> Footprint:
    """:func:`ctxext.planner.footprint.footprint` plus the device's runtime terms."""
    fp = footprint(shape, setup)
    if device.kind == "cuda":
        buffers = flash_backward_buffers(shape, setup)
        fp.add(
            "activations",
            "flash-attention backward buffers",
            sum(b for _, b in buffers),
            " + ".join(name for name, _ in buffers) + " (from the kernel's source)",
            ("attention backward",),
        )
        dynamic = max(fp.group_total("activations", p) + fp.group_total("loss", p) for p in PHASES)
        fp.add(
            "overhead", "CUDA context + workspaces", CUDA_CONTEXT, "outside PyTorch's allocator (typical, not measured)"
        )
        share = CUDA_FRAGMENTATION_EXPANDABLE if setup.expandable_segments else CUDA_FRAGMENTATION
        how = "expandable segments" if setup.expandable_segments else "caching allocator"
        fp.add("overhead", "allocator fragmentation", share * dynamic, f"{share:.0%} of the activations ({how})")
        return fp
    fp.add(
        "activations",
        "CPU attention backward buffers",
        cpu_attention_backward_buffers(shape, setup),
        "the CPU SDPA kernel's accumulators (memory profiler, isolated SDPA backward)",
        ("attention backward",),
    )
    fp.add("overhead", "Python + torch runtime", CPU_RUNTIME, "fitted on this CPU (benchmarks/plan_accuracy.py)")
    fp.add(
        "overhead",
        "malloc retention",
        shape.layers * heap_layer_bytes(shape, setup, MMAP_THRESHOLD_MAX),
        "freed activation memory glibc keeps: one forward pass of saved tensors under 32 MiB each",
        FWD_BWD,
    )
    return fp


def usable(device: Device) -> int:
    """The memory a plan may use: the device's capacity less the headroom."""
    return int(device.memory * (1 - HEADROOM))


def upper(total: int, device: Device) -> int:
    """The upper end of a planned peak's error band on a device (what has to fit)."""
    return band_of(total, device.kind).high


def fits(shape: ModelShape, setup: Setup, device: Device) -> bool:
    """Whether the upper end of the step's planned peak (with its band) fits the device's usable memory."""
    return upper(device_footprint(shape, setup, device).total, device) <= usable(device)


def longest_fit(shape: ModelShape, setup: Setup, device: Device, step: int = 1024, limit: int = 1 << 24) -> int | None:
    """The longest ``seq_len`` (a multiple of ``step``, at most ``limit``) whose band fits, or ``None``.

    Memory grows with the length, so a binary search over multiples of ``step`` finds the boundary.
    """
    unit = step * setup.split

    def ok(n: int) -> bool:
        return fits(shape, dataclasses.replace(setup, seq_len=n * unit), device)

    if not ok(1):
        return None
    lo, hi = 1, 2
    while hi * unit <= limit and ok(hi):
        lo, hi = hi, hi * 2
    if hi * unit > limit:
        return lo * unit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo * unit
