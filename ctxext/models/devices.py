"""Accelerators a recipe can be planned against: a table of common GPUs, memory sizes, and this CPU.

Memory is the capacity the driver reports (``nvidia-smi`` / ``rocm-smi`` "total", in MiB, as commonly
printed for each part), not the marketing number: an "80 GB" H100 shows 81,559 MiB. Throughput is the
vendor datasheet's dense (no 2:4 sparsity) bf16 tensor-core peak with fp32 accumulation, the number a
PyTorch bf16 matmul can approach; V100 has no bf16 and lists its fp16 peak.

Sources (datasheets, checked 2026): NVIDIA A100 datasheet (312 TFLOPs bf16), H100 datasheet (SXM 989,
PCIe 756), H200 datasheet (989), L4 (121), L40S (362), NVIDIA Ampere GA102 whitepaper (RTX 3090: 71 with fp32
accumulate), Ada Lovelace whitepaper (RTX 4090: 165), V100 datasheet (SXM2 fp16 tensor 125), AWS G5 / A10G
(70, as AWS quotes it), AMD Instinct MI300X datasheet (1307 bf16 dense, 192 GB HBM3).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ctxext.errors import InputError

if TYPE_CHECKING:
    import torch

GIB = 2**30


@dataclass(frozen=True)
class Device:
    """One accelerator (or this CPU's RAM) to plan against.

    Attributes:
        name: table name, or a description.
        memory: usable bytes per device.
        tflops: dense bf16 peak, TFLOP/s (``None`` when unknown, e.g. ``--gpu-memory``).
        kind: ``cuda`` (any GPU: bf16 compute, CUDA context) or ``cpu`` (fp32 compute, host RAM).
        note: where the numbers come from.
    """

    name: str
    memory: int
    tflops: float | None
    kind: str = "cuda"
    note: str = ""


def _gpu(name: str, mib: int, tflops: float, note: str = "") -> Device:
    return Device(name=name, memory=mib * 2**20, tflops=tflops, kind="cuda", note=note)


# name → (driver-reported memory in MiB, dense bf16 TFLOP/s). See the module docstring for sources.
GPUS: dict[str, Device] = {
    d.name: d
    for d in (
        _gpu("a100-40gb", 40960, 312),
        _gpu("a100-80gb", 81920, 312),
        _gpu("h100-80gb", 81559, 989, "H100 SXM5"),
        _gpu("h100-pcie", 81559, 756),
        _gpu("h200", 143771, 989, "H200 SXM"),
        _gpu("l4", 23034, 121),
        _gpu("l40s", 46068, 362),
        _gpu("a10g", 23028, 70, "AWS G5"),
        _gpu("rtx-3090", 24576, 71),
        _gpu("rtx-4090", 24564, 165),
        _gpu("v100-32gb", 32768, 125, "no bf16: fp16 tensor peak"),
        _gpu("mi300x", 196608, 1307, "AMD ROCm"),
    )
}


def gpu(name: str) -> Device:
    """A GPU from the table by name (case-insensitive; ``_`` and spaces read as ``-``).

    Raises:
        InputError: an unknown name; the message lists the known ones.
    """
    key = re.sub(r"[\s_]+", "-", name.strip().lower())
    if key not in GPUS:
        raise InputError(
            f"--gpu: unknown GPU {name!r}; known: {', '.join(GPUS)}. For another GPU pass its memory instead, "
            "e.g. --gpu-memory 48GB"
        )
    return GPUS[key]


_UNITS = {
    "": GIB,
    "g": GIB,
    "gib": GIB,
    "gb": 10**9,
    "m": 2**20,
    "mib": 2**20,
    "mb": 10**6,
    "t": 2**40,
    "tib": 2**40,
    "tb": 10**12,
}


def parse_memory(text: str) -> int:
    """Bytes from a size such as ``80GB`` (10⁹ bytes), ``80GiB`` or ``24g`` (2³⁰), ``40960MiB``; a bare number is GiB.

    Raises:
        InputError: anything else, naming the accepted forms.
    """
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text or "")
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise InputError(
            f"--gpu-memory: cannot read {text!r} as a memory size; write a number and a unit, e.g. 80GB, 80GiB, "
            "24g or 40960MiB (GB/MB/TB are powers of ten, GiB/g/MiB powers of two)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def custom_gpu(memory: str, tflops: float | None = None) -> Device:
    """A GPU described only by its memory (``--gpu-memory``), optionally its bf16 TFLOP/s."""
    size = parse_memory(memory)
    if tflops is not None and not (math.isfinite(tflops) and tflops > 0):
        raise InputError(f"--tflops {tflops}: must be a positive number (the GPU's dense bf16 TFLOP/s)")
    return Device(name=f"GPU with {size / GIB:.1f} GiB", memory=size, tflops=tflops, note="--gpu-memory")


def _meminfo_kb(field: str) -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_device(processes: int = 1) -> Device:
    """This machine's CPU and RAM: what is available now (``MemAvailable``), fp32 compute.

    Args:
        processes: the processes of a launch that share this machine. With more than one, each gets its share of
            the total RAM: what is available changes from moment to moment, and every process of a launch must
            plan the same (what ``ctxext train`` decides from the plan, :mod:`ctxext.planner.autofit`).
    """
    kb = _meminfo_kb("MemAvailable") or _meminfo_kb("MemTotal")
    if not kb:
        kb = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 1024
    total = _meminfo_kb("MemTotal") or kb
    if processes > 1:
        kb = total // processes
        return Device(
            name=f"CPU RAM ({kb / 2**20:.1f} GiB: 1/{processes} of {total / 2**20:.1f})",
            memory=kb * 1024,
            tflops=None,
            kind="cpu",
            note=f"no GPU: planned against this machine's RAM, shared by {processes} processes",
        )
    return Device(
        name=f"CPU RAM ({kb / 2**20:.1f} of {total / 2**20:.1f} GiB available)",
        memory=kb * 1024,
        tflops=None,
        kind="cpu",
        note="no GPU: planned against this machine's RAM",
    )


def resolve_device(device: str | None = None, flag: str = "--device") -> torch.device:
    """The torch device a command runs on: ``cuda`` when available for ``None`` / ``auto``, else what was asked.

    Args:
        device: ``None`` / ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        flag: the option that named it, for messages.

    Returns:
        The device.

    Raises:
        InputError: not a device name, a device type ctxext does not run on, or CUDA asked for where torch has
            none (a CPU build, no driver) or has fewer GPUs.
    """
    import torch

    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(str(device))
    except (RuntimeError, ValueError):
        raise InputError(f"{flag} {device}: not a device name; use cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise InputError(f"{flag} {device}: ctxext runs on cpu or cuda (cuda:N), not {dev.type}")
    if not torch.cuda.is_available():
        why = "this torch is a CPU build" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise InputError(f"{flag} {device}: {why}; use --device cpu (or omit it)")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise InputError(f"{flag} {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return dev
