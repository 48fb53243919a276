"""``ctxext plan``: will a recipe fit on given GPUs, how long is the longest sequence that does, what to change.

Config-only: the model's ``config.json`` is read (``transformers.AutoConfig``; a local folder, the HF cache, a
built-in model, or, offline, a bundled copy of a few published configs), never its weights. The per-process
memory comes from :mod:`ctxext.planner.footprint`; this module adds the runtime overheads of the device, searches for
the longest fitting ``seq_len``, re-plans each piece of advice, and estimates throughput from the device's
bf16 FLOP/s at a stated utilisation. The formulas are in ``docs/memory-model.md``, their checks against measured
steps and published figures in ``docs/results-planning.md``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxext.errors import InputError
from ctxext.models.devices import GIB, Device
from ctxext.planner.advice import Advice, advise, replication_notes
from ctxext.planner.autofit import Choice, choose, left_to_machine, with_overrides
from ctxext.planner.band import Band, band_of
from ctxext.planner.fit import CPU_RUNTIME, device_footprint, longest_fit, upper, usable
from ctxext.planner.footprint import Footprint, ModelShape, Setup
from ctxext.planner.levers import lever_effects, lever_fields
from ctxext.planner.setup import shape_names
from ctxext.recipe.sections import FINETUNE_MODES
from ctxext.resources import RESOURCES

BUNDLED_CONFIGS = RESOURCES / "hub-configs"
SHARDINGS = ("none", "ddp", "fsdp2", "zero3")

DEFAULT_UTILIZATION = 0.40  # model FLOPs utilisation assumed for tokens/s (QLoRA on one GPU: 30-50 % typical)


@dataclass
class Plan:
    """The plan of one recipe on one kind of device."""

    model: str
    config_source: str
    shape: ModelShape
    device: Device
    setup: Setup
    memory: Footprint
    fits: bool
    longest: int | None = None
    advice: list[Advice] = field(default_factory=list)
    flops_per_token: float = 0.0
    tokens_per_second: float | None = None
    utilization: float = DEFAULT_UTILIZATION
    tokens_per_step: int = 0
    all_to_all_per_step: int = 0
    max_steps: int = 0
    notes: list[str] = field(default_factory=list)
    what_if: dict[str, int] = field(default_factory=dict)
    levers: list[Any] = field(default_factory=list)
    mode: str = "qlora"
    band: Band | None = None
    choice: Choice | None = None

    @property
    def wall_seconds(self) -> float | None:
        """Estimated time of the recipe's ``max_steps``."""
        if not self.tokens_per_second:
            return None
        return self.max_steps * self.tokens_per_step / self.tokens_per_second

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record (``ctxext plan --json``)."""
        return {
            "model": self.model,
            "config_source": self.config_source,
            "device": {
                "name": self.device.name,
                "memory_gib": self.device.memory / GIB,
                "bf16_tflops": self.device.tflops,
                "kind": self.device.kind,
            },
            "setup": dataclasses.asdict(self.setup),
            "components": [
                {**dataclasses.asdict(c), "gib": c.bytes / GIB, "phases": list(c.phases), "basis": c.basis}
                for c in self.memory.components
            ],
            "mode": self.mode,
            "peak_phase": self.memory.peak_phase,
            "total_gib": self.memory.total / GIB,
            "band_gib": [self.band.low / GIB, self.band.high / GIB] if self.band else None,
            "band_relative": [self.band.rel_low, self.band.rel_high] if self.band else None,
            "band_source": self.band.describe() if self.band else None,
            "usable_gib": usable(self.device) / GIB,
            "fits": self.fits,
            "longest_seq_len": self.longest,
            "advice": [dataclasses.asdict(a) | {"total_gib": a.total / GIB} for a in self.advice],
            "flops_per_token": self.flops_per_token,
            "utilization": self.utilization,
            "tokens_per_second": self.tokens_per_second,
            "tokens_per_step": self.tokens_per_step,
            "all_to_all_gib_per_step": self.all_to_all_per_step / GIB,
            "max_steps": self.max_steps,
            "wall_seconds": self.wall_seconds,
            "what_if_gib": {k: v / GIB for k, v in self.what_if.items()},
            "levers": [e.to_dict() for e in self.levers],
            "notes": self.notes + self.memory.notes,
            "left_to_machine": dataclasses.asdict(self.choice) if self.choice else None,
        }


# ------------------------------------------------------------------------------------------------
# The model's config, without weights
# ------------------------------------------------------------------------------------------------


def bundled_config_dir(ref: str) -> Path | None:
    """The folder of ctxext's bundled copy of a published Hub config, if it has one."""
    folder = BUNDLED_CONFIGS / ref.replace("/", "--")
    return folder if (folder / "config.json").is_file() else None


def read_model_config(ref: str, revision: str | None = None, trust_remote_code: bool = False) -> tuple[Any, str]:
    """A model's config (no weights) and where it came from.

    A Hub id whose published config ctxext bundles is read from the bundled copy, without the network (the
    published config.json of a released model does not change, and an offline machine would otherwise wait
    through the Hub client's retries first). Anything else is read as it is (folder, ``builtin:NAME``, HF cache /
    Hub).

    Raises:
        InputError: the config cannot be read; the message says how to fix it.
    """
    from transformers import AutoConfig

    from ctxext.models.refs import is_hub_id
    from ctxext.models.sources import SourceError, load_config

    bundled = bundled_config_dir(ref) if is_hub_id(ref) and revision is None else None
    if bundled is not None:
        return AutoConfig.from_pretrained(bundled), f"bundled copy of the published {ref} config.json"
    try:
        config, folder = load_config(ref, revision=revision, trust_remote_code=trust_remote_code)
        return config, str(folder)
    except (SourceError, OSError, ValueError) as exc:
        known = ", ".join(p.name.replace("--", "/") for p in sorted(BUNDLED_CONFIGS.iterdir()))
        raise InputError(
            f"model.path: cannot read the config of {ref!r} ({exc}). The planner needs only its config.json: "
            f"pass model.path=/a/folder/with/config.json, or plan where the Hub is reachable. Bundled offline "
            f"configs: {known}"
        ) from None


# ------------------------------------------------------------------------------------------------
# Recipe → setup
# ------------------------------------------------------------------------------------------------


# How the weights are trained (the recipe schema's ``train.mode``).
MODES = FINETUNE_MODES


def finetune_mode(recipe: Any) -> str:
    """The recipe's fine-tuning mode: its ``train.mode`` (resolved by the schema when not given)."""
    return str(recipe.train.mode)


def with_mode(recipe: Any, mode: str | None) -> tuple[Any, str]:
    """The recipe as ``mode`` trains it (``--mode``): a 4-bit base for QLoRA, none for LoRA and full fine-tuning.

    Raises:
        InputError: an unknown mode.
    """
    if mode is None:
        mode = finetune_mode(recipe)
    if mode not in MODES:
        raise InputError(f"--mode: unknown {mode!r}; choose one of: {', '.join(MODES)}")
    quantization = recipe.quantization.mode
    wanted = (quantization if quantization != "none" else "nf4") if mode == "qlora" else "none"
    if wanted != quantization:
        recipe = recipe.model_copy(deep=True)
        recipe.quantization.mode = wanted
    return recipe, mode


def setup_mode(setup: Setup) -> str:
    """The mode a setup trains in (``qlora``, ``lora`` or ``full``)."""
    return "full" if setup.finetune == "full" else "qlora" if setup.quantized else "lora"


def _launch_checks(train: Any, world: int, sharding: str) -> None:
    cp, sp = train.context_parallel_size, train.sequence_parallel_size
    if sharding not in SHARDINGS:
        raise InputError(f"--sharding: unknown {sharding!r}; choose one of: {', '.join(SHARDINGS)}")
    if cp > 1 and sharding != "fsdp2":
        raise InputError(
            "train.context_parallel_size: accelerate's context parallelism runs under FSDP2; use --sharding fsdp2"
        )
    if world % cp:
        raise InputError(f"train.context_parallel_size: {cp} does not divide the {world} GPU(s) of the job")
    if world % sp:
        raise InputError(f"train.sequence_parallel_size: {sp} does not divide the {world} GPU(s) of the job")


def setup_for(
    recipe: Any,
    device: Device,
    world: int,
    sharding: str | None,
    loss: str = "chunked",
    mode: str | None = None,
    offload_optimizer: bool = False,
) -> Setup:
    """The training setup a recipe gives on a device and a launch, as ctxext's training loop builds it.

    Args:
        recipe: a validated recipe.
        device: the device of each process.
        world: processes in the job.
        sharding: ``auto`` / ``None`` (FSDP2 with context parallelism or a multi-GPU full fine-tune, else none),
            ``none``, ``ddp``, ``fsdp2`` or ``zero3``.
        loss: ``chunked`` or ``full``.
        mode: ``qlora``, ``lora`` or ``full`` (``None``: the recipe's, :func:`finetune_mode`).
        offload_optimizer: a full fine-tune's optimizer states live in host memory.

    Raises:
        InputError: an impossible launch (a split not dividing the GPUs, CP without FSDP2), an unknown mode.
    """
    recipe, mode = with_mode(recipe, mode)
    full = mode == "full"
    if offload_optimizer and not full:
        raise InputError(
            "--offload-optimizer: plans a full fine-tune's optimizer states in host memory (--mode full); "
            "LoRA's states are small, and paged 8-bit AdamW already pages them"
        )
    train = recipe.train
    if sharding is None or sharding == "auto":
        sharding = "fsdp2" if train.context_parallel_size > 1 or (full and world > 1) else "none"
    _launch_checks(train, world, sharding)
    cuda = device.kind == "cuda"
    if recipe.quantization.compute_dtype == "auto":
        compute_bytes = 2 if cuda else 4
    else:
        compute_bytes = 4 if recipe.quantization.compute_dtype == "float32" else 2
    optimizer = train.optimizer
    if optimizer == "auto":
        # A full fine-tune's mixed-precision AdamW keeps fp32 moments (bitsandbytes' paged 8-bit AdamW is the
        # adapters' GPU default).
        optimizer = "paged_adamw_8bit" if cuda and not full else "adamw"
    attention = recipe.model.attn_implementation
    if attention == "auto":
        attention = "sdpa"  # flash-attn when installed: the same (linear) memory order
    targets, extras = shape_names(list(recipe.lora.target_modules), list(recipe.lora.extra_trainable))
    levers = lever_fields(recipe, device.kind, compute_bytes)
    if full:
        levers["lora_dropout"] = 0.0
    return Setup(
        seq_len=recipe.seq_len,
        micro_batch=train.micro_batch_size,
        accumulation=train.gradient_accumulation_steps,
        quantization=recipe.quantization.mode,
        double_quant=recipe.quantization.double_quant,
        compute_bytes=compute_bytes,
        lora_r=recipe.lora.r,
        lora_targets=() if full else targets,
        extra_trainable=() if full else extras,
        optimizer=optimizer,
        checkpointing=train.checkpointing,
        attention=attention,
        loss=loss,
        loss_chunk=train.loss_chunk_size,
        world=world,
        context_parallel=train.context_parallel_size,
        sequence_parallel=train.sequence_parallel_size,
        sharding="none" if sharding == "ddp" else sharding,
        finetune="full" if full else "lora",
        offload_optimizer=offload_optimizer,
        cuda=cuda,
        **levers,
    )


# ------------------------------------------------------------------------------------------------
# Throughput
# ------------------------------------------------------------------------------------------------


def flops_per_token(shape: ModelShape, setup: Setup) -> float:
    """Training FLOPs per token: 6·N for the matmul weights plus causal attention, × 4/3 with recomputation.

    N counts the projections and the output head. Attention: QKᵀ and AV over a causal mask cost
    2·2·T·d_q/2 FLOPs per token and layer forward, ×3 with the backward. 6·N also counts the weight
    gradients of frozen 4-bit weights, which are not formed: an upper bound of the work, offset in practice by
    nf4 dequantisation.
    """
    n = shape.matmul_params()
    attn = 6 * shape.layers * setup.seq_len * shape.heads * shape.head_dim
    total = 6 * n + attn
    # The tiled MLP recomputes each shard's MLP forward once more in the backward pass (2 FLOPs per weight).
    tiled = 2 * shape.layers * 3 * shape.hidden * shape.intermediate if setup.tiled_mlp is not None else 0
    return total * (4 / 3 if setup.checkpointing else 1) + tiled


# ------------------------------------------------------------------------------------------------
# The workflow
# ------------------------------------------------------------------------------------------------


def _check_heads(shape: ModelShape, setup: Setup) -> None:
    """Refuse a split that training refuses, with training's message (the one rule: ``ulysses_plan``)."""
    from ctxext.recipe.parallel import SPLIT_KEY, ulysses_plan

    plan = ulysses_plan(shape.heads, shape.kv_heads, setup.sequence_parallel)
    if isinstance(plan, str):
        raise InputError(f"{SPLIT_KEY}: {setup.sequence_parallel} {plan}")


def what_if(shape: ModelShape, setup: Setup, device: Device) -> dict[str, int]:
    """The same step's peak with checkpointing and the loss flipped, for comparison (the table shows the recipe's)."""
    flips: dict[str, dict[str, Any]] = {
        f"checkpointing {'off' if setup.checkpointing else 'on'}": {"checkpointing": not setup.checkpointing},
        "full logits" if setup.loss == "chunked" else "chunked loss": {
            "loss": "full" if setup.loss == "chunked" else "chunked"
        },
    }
    return {
        label: device_footprint(shape, dataclasses.replace(setup, **change), device).total
        for label, change in flips.items()
    }


def _setup_of(recipe: Any, args: tuple[Any, ...]) -> Setup:
    return setup_for(recipe, *args)


def _choose(recipe: Any, shape: ModelShape, device: Device, setup_of: Any) -> Choice:
    """What the recipe leaves to the machine (auto checkpointing, a micro-batch that may shrink), for ``device``."""
    return choose(
        recipe, setup_of, lambda s: upper(device_footprint(shape, s, device).total, device), usable(device), device.name
    )


def plan_recipe(
    recipe: Any,
    device: Device,
    *,
    num_gpus: int = 1,
    nodes: int = 1,
    sharding: str | None = "auto",
    loss: str = "chunked",
    utilization: float = DEFAULT_UTILIZATION,
    advise_changes: bool = True,
    search: bool = True,
    config: Any = None,
    config_source: str | None = None,
    mode: str | None = None,
    offload_optimizer: bool = False,
    decide: bool = True,
) -> Plan:
    """Plan a validated recipe on ``num_gpus × nodes`` devices.

    Args:
        recipe: a :class:`ctxext.recipe.schema.Recipe`.
        device: the device each process runs on (:mod:`ctxext.models.devices`).
        num_gpus: GPUs per node.
        nodes: nodes.
        sharding: ``auto`` (FSDP2 with context parallelism, else none; ``None`` too), ``none`` / ``ddp``, ``fsdp2``
            or ``zero3``.
        loss: ``chunked`` (what ctxext trains with) or ``full`` (full-length logits, for comparison).
        utilization: the fraction of the device's bf16 peak assumed for tokens/s.
        advise_changes: re-plan changes when the recipe does not fit.
        search: find the longest fitting ``seq_len``.
        config: a transformers config to use instead of reading ``model.path``.
        config_source: where ``config`` came from, for the report.
        mode: ``qlora``, ``lora`` or ``full`` (``None``: the recipe's).
        offload_optimizer: a full fine-tune's optimizer states in host memory.
        decide: plan what the recipe leaves to the machine as decided for ``device`` (:mod:`.autofit`), not as given.

    Returns:
        The :class:`Plan`.

    Raises:
        InputError: a config that cannot be read, a bad launch.
    """
    if num_gpus < 1 or nodes < 1:
        raise InputError("--num-gpus and --nodes must be at least 1")
    if not 0 < utilization <= 1:
        raise InputError("--utilization: a fraction in (0, 1], e.g. 0.4")
    if config is None:
        config, config_source = read_model_config(
            recipe.model.path, recipe.model.revision, recipe.model.trust_remote_code
        )
    shape = ModelShape.from_config(config)
    world = num_gpus * nodes
    setup_of = functools.partial(_setup_of, args=(device, world, sharding, loss, mode, offload_optimizer))
    _check_heads(shape, setup_of(recipe))  # before any plan: a split the heads refuse (the choice keeps the split)
    choice = _choose(recipe, shape, device, setup_of) if decide and left_to_machine(recipe) else None
    if choice is not None:
        recipe = with_overrides(recipe, choice.overrides)
    setup = setup_of(recipe)
    memory = device_footprint(shape, setup, device)
    band = band_of(memory.total, device.kind)
    ok = band.high <= usable(device)
    plan = Plan(
        model=recipe.model.path,
        config_source=config_source or "given",
        shape=shape,
        device=device,
        setup=setup,
        memory=memory,
        fits=ok,
        utilization=utilization,
        max_steps=recipe.train.max_steps,
        mode=setup_mode(setup),
        band=band,
        choice=choice,
    )
    plan.notes += replication_notes(shape, setup, device)
    if search:
        plan.longest = longest_fit(shape, setup, device)
        plan.levers = lever_effects(shape, setup, device, lambda *a: device_footprint(*a).total, longest_fit)
    if advise_changes and not ok:
        plan.advice = advise(shape, setup, device)
    plan.what_if = what_if(shape, setup, device)
    plan.flops_per_token = flops_per_token(shape, setup)
    data_parallel = world // setup.split
    ga = recipe.train.gradient_accumulation_steps
    plan.tokens_per_step = ga * setup.micro_batch * setup.seq_len * data_parallel
    plan.all_to_all_per_step = ga * memory.all_to_all
    if plan.all_to_all_per_step:
        gib = plan.all_to_all_per_step / GIB
        plan.notes.append(f"Ulysses all-to-all: {gib:.2f} GiB sent per GPU per step (q, k, v, output; all passes)")
    if device.tflops:
        plan.tokens_per_second = utilization * device.tflops * 1e12 * world / plan.flops_per_token
    probe = probe_note(recipe, shape, setup, plan, window=_original_window(config))
    if probe:
        plan.notes.append(probe)
    if device.kind == "cpu":
        plan.notes.append(
            "no GPU: planned against this machine's RAM with fp32 compute (what ctxext trains with on a CPU)"
        )
    if getattr(config, "sliding_window", None) and setup.seq_len > int(config.sliding_window):
        plan.notes.append(
            f"the config has a {config.sliding_window}-token sliding window; memory is planned for full attention"
        )
    return plan


def probe_note(recipe: Any, shape: ModelShape, setup: Setup, plan: Plan, window: int | None = None) -> str | None:
    """What the adaptive stop's probe (``train.probe``) adds: its forward's memory and its share of the compute.

    The probe runs forward passes at the probe length without gradients, one decoder layer's tensors alive at a
    time: the residual stream and its norm, q / attention output, k / v, and the MLP's gate, up and product, for
    the sequences of one pass. Its peak is that beside what the step holds outside its activations and loss.
    With ``train.probe.forms: window`` it also checks, once before the first step, which key forms the base
    retrieves inside its ``window`` (:mod:`ctxext.tasks.forms`): at most that many passes per form, at the window's
    length, so never more memory than a probe's.
    """
    probe, length = recipe.train.probe, recipe.probe_length
    if probe is None or length is None:
        return None
    memory, b = plan.memory, setup.compute_bytes
    from ctxext.recipe.sections import PROBE_BATCH_TOKENS

    tokens = max(1, PROBE_BATCH_TOKENS // length) * length
    kv = 2 * shape.kv_heads * shape.head_dim
    transient = tokens * (4 * shape.hidden + kv + 3 * shape.intermediate) * b
    peak = memory.peak_phase
    static = memory.total - memory.group_total("activations", peak) - memory.group_total("loss", peak)
    passes = -(-probe.trials // probe.keys)
    forward = 2 * shape.matmul_params() + 2 * shape.layers * length * shape.heads * shape.head_dim
    probe_flops = passes * length * forward
    train_flops = probe.interval * plan.tokens_per_step * plan.flops_per_token
    share = probe_flops / (probe_flops + train_flops) if train_flops else 0.0
    once = ""
    if probe.forms == "window" and window:
        from ctxext.tasks.forms import PROBES_PER_DEPTH, WINDOW_DEPTHS

        checks = PROBES_PER_DEPTH * WINDOW_DEPTHS * len(recipe.probe_forms())
        once = f"; once before the first step, at most {checks} at the base's {window}-token window (its key forms)"
    return (
        f"train.probe: {passes} forward passes at {length} tokens without gradients every {probe.interval} steps: "
        f"~{transient / GIB:.2f} GiB of activations (peak ~{(static + transient) / GIB:.2f} GiB beside the step's "
        f"{memory.total / GIB:.2f} GiB), ~{share:.1%} of the run's compute{once}"
    )


def _original_window(config: Any) -> int | None:
    """The base's own window (its RoPE's original length), or None where the config has none."""
    from ctxext.rope.read import read_rope

    try:
        return int(read_rope(config).original_length)
    except InputError:  # a RoPE the reader refuses (ctxext extend says why) only loses the note's last clause
        return None


def cpu_runtime_note() -> str:
    """How the CPU terms were obtained (for benchmark reports)."""
    return (
        f"CPU runtime terms in `ctxext/planner/fit.py`: Python + torch runtime {CPU_RUNTIME / 2**20:.0f} MiB (the one "
        "fitted constant: the mean, over all cells, of the resident memory after loading and a 128-token warm-up "
        "step, less the model's predicted weights and trainable state) and malloc retention = one forward pass "
        "of saved activations, without tensors of 32 MiB or more once the residual stream's are (a structural "
        "term with coefficient 1, chosen after forced-mmap runs showed that glibc keeps freed heap memory; the "
        "second table compares the activation formulas with the live peak; see docs/results-planning.md)."
    )


# ------------------------------------------------------------------------------------------------
# Before `ctxext train`
# ------------------------------------------------------------------------------------------------


def this_device() -> tuple[Device, int, str | None]:
    """The device this process will train on, the job's process count, and its sharding (from accelerate's env).

    On CUDA the GPU's own memory (and its bf16 peak when it is in the table); on the CPU, this machine's RAM.
    """
    import os

    import torch

    from ctxext.models.devices import GPUS, cpu_device

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    sharding = None
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        sharding = "fsdp2"
    elif os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        sharding = "zero3"
    if not torch.cuda.is_available():
        return cpu_device(int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)), world, sharding
    index = int(os.environ.get("LOCAL_RANK", "0") or 0) % torch.cuda.device_count()
    props = torch.cuda.get_device_properties(index)
    name = props.name.lower()
    tflops = next((d.tflops for key, d in GPUS.items() if key.split("-")[0] in name), None)
    return Device(name=props.name, memory=int(props.total_memory), tflops=tflops, kind="cuda"), world, sharding


def plan_on_this_machine(recipe: Any, decide: bool = True) -> Plan:
    """The plan of a recipe on the device and launch this process is in (what ``ctxext train`` checks first).

    ``decide``: as :func:`plan_recipe`'s.

    Raises:
        InputError: the model's config cannot be read (the caller decides whether that matters).
    """
    device, world, sharding = this_device()
    if recipe.train.context_parallel_size > 1 and device.kind == "cpu":
        sharding = None
        recipe = recipe.model_copy(deep=True)
        recipe.train.context_parallel_size = 1
    return plan_recipe(
        recipe, device, num_gpus=world, sharding=sharding, search=False, advise_changes=True, decide=decide
    )
