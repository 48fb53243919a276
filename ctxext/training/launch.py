"""The accelerate side of a training run: the accelerator, the launch checks, the data-parallel geometry."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ctxext.artifacts.run_record import RunRecord
from ctxext.errors import CtxextError, InputError
from ctxext.recipe.hardware import compute_dtype_name
from ctxext.recipe.parallel import check_split_launch
from ctxext.recipe.schema import Recipe
from ctxext.training.sequence_parallel import SequenceSplit

# The launcher's requests for sharded weights (set by `accelerate launch --use_fsdp / --use_deepspeed` and configs).
SHARDED_LAUNCHES = {"ACCELERATE_USE_FSDP": "FSDP", "ACCELERATE_USE_DEEPSPEED": "DeepSpeed"}
# accelerate's mixed-precision setting for a full fine-tune's compute dtype (its weights stay fp32).
MIXED_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "no"}


@dataclass
class Launch:
    """The accelerator of this process and where the process stands in the job.

    Attributes:
        accelerator: the ``accelerate.Accelerator``.
        world: data-parallel processes (processes / context- or sequence-parallel size).
        rank: this process's data-parallel rank.
        cp: the context-parallel size in use (1 without it).
        split: this process's share of each sequence (:mod:`ctxext.training.sequence_parallel`); set once the
            model is loaded, no split until then.
    """

    accelerator: Any
    world: int
    rank: int
    cp: int
    split: SequenceSplit = field(default_factory=SequenceSplit)

    @property
    def main(self) -> bool:
        """Whether this is the process that writes the run folder."""
        return bool(self.accelerator.is_main_process)

    def topology(self) -> dict[str, Any]:
        """Where the job runs and how it splits each sequence: the run record's ``topology``.

        Processes per node come from the launcher (``LOCAL_WORLD_SIZE`` from torchrun and accelerate launch, which
        runs it; ``LOCAL_SIZE`` from DeepSpeed's); without one the job is one process on one node.
        """
        processes = int(self.accelerator.num_processes)
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or processes)
        return {
            "world_size": processes,
            "nodes": max(1, processes // per_node),
            "processes_per_node": per_node,
            "data_parallel": self.world,
            "sequence_parallel": self.split.size,
            "context_parallel": self.cp,
            "ulysses": self.split.engine,
            "sharding": sharding_engine(self.accelerator),
        }

    def check_resume(self, previous: RunRecord | None) -> None:
        """Refuse to resume a run (``previous``: its record; ``None``: a new run) on another number of processes.

        Any split of the same number into nodes is fine.

        Raises:
            InputError: naming both counts.
        """
        if previous is None:
            return
        before, now = previous.num_processes, int(self.accelerator.num_processes)
        if before is not None and before != now:
            raise InputError(
                f"--resume: the run was trained on {before} process(es) and this launch has {now}: the rows each "
                "process reads, the batch of a step and the saved random states are per process, so the run would "
                f"not continue as it began. Resume it with {before} processes (on any number of nodes), or start a "
                "new output.dir"
            )


def sharding_engine(accelerator: Any) -> str:
    """How accelerate holds the weights over the job: ``fsdp2`` (or 1), ``zero3`` (or N), ``ddp`` or ``none``."""
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.FSDP:
        return f"fsdp{getattr(accelerator.state.fsdp_plugin, 'fsdp_version', 1)}"
    if kind == DistributedType.DEEPSPEED:
        return f"zero{accelerator.state.deepspeed_plugin.zero_stage}"
    return "ddp" if accelerator.num_processes > 1 else "none"


def start_accelerator(recipe: Recipe, out: Path) -> Launch:
    """Create the accelerator for a recipe and check that the launch makes one synchronised job.

    Args:
        recipe: the training recipe.
        out: the run folder (trackers log under ``out/logs``).

    Returns:
        The :class:`Launch`.

    Raises:
        CtxextError: several processes that accelerate does not see as one job.
    """
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    check_sharded_launch()
    cfg = recipe.train
    acc_kwargs: dict[str, Any] = {"dataloader_config": DataLoaderConfiguration(split_batches=False)}
    if cfg.tracker != "none":
        acc_kwargs.update(log_with=cfg.tracker, project_dir=str(out / "logs"))
    if cfg.mode == "full":
        # fp32 master weights (ctxext.training.model), computed in the run's dtype by accelerate's mixed precision:
        # autocast under DDP, FSDP2's bf16 parameter policy, DeepSpeed's bf16 engine with fp32 optimizer copies.
        dtype = compute_dtype_name(recipe.quantization.compute_dtype, torch.cuda.is_available())
        acc_kwargs["mixed_precision"] = MIXED_PRECISION[dtype]
    accelerator = Accelerator(**acc_kwargs)
    check_launch(accelerator, recipe)
    # The processes sharing a sequence are consecutive (the split's grid, DeepSpeed's groups): they share a
    # data-parallel rank. The ring is torch's context parallelism on that grid (training/sequence_parallel.py), not
    # accelerate's ParallelismConfig, which refuses a ring beside a head split.
    cp = cfg.context_parallel_size
    group = cp * cfg.sequence_parallel_size
    return Launch(accelerator, accelerator.num_processes // group, accelerator.process_index // group, cp)


def check_sharded_launch() -> None:
    """Refuse an FSDP or DeepSpeed launch on the CPU, before accelerate starts.

    accelerate shards with them on GPUs only: on the CPU it falls back to plain data parallelism (every process
    holding the whole model and its optimizer states) or fails inside its own plugin, neither what was asked for.

    Raises:
        CtxextError: naming the engine and the CPU launch that works (exit code 2).
    """
    asked = next((name for env, name in SHARDED_LAUNCHES.items() if os.environ.get(env, "").lower() == "true"), None)
    on_cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" or not torch.cuda.is_available()
    if asked and on_cpu:
        raise CtxextError(
            f"the launch asks for {asked}, but accelerate shards with {asked} on GPUs only; on the CPU it would fall "
            "back to plain data parallelism, each process holding the whole model. Launch on GPUs, or without "
            f"{asked} on the CPU (`ACCELERATE_USE_CPU=true accelerate launch --multi_gpu ...`: DDP over gloo)",
            exit_code=2,
        )


def check_launch(accelerator: Any, recipe: Recipe) -> None:
    """Refuse a launch that would not train one model: see :func:`start_accelerator`."""
    # A launcher that started several processes which accelerate does not see as one job: each would
    # train its own unsynchronised copy and write the same folder (``docs/design.md`` lists how this happens).
    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    if world_env > 1 and accelerator.num_processes == 1:
        raise CtxextError(
            f"the launcher started {world_env} processes (WORLD_SIZE={world_env}) but accelerate sees only one: "
            "each process would train an unsynchronised copy. Without CUDA, launch with "
            "`ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes N -m ctxext train ...`; "
            "with GPUs, check that CUDA is visible to every process. To train on one process, run `ctxext train` "
            "directly.",
            exit_code=2,
        )
    cfg = recipe.train
    check_split_launch(cfg.sequence_parallel_size, accelerator.num_processes, cfg.context_parallel_size)


def configure_deepspeed(accelerator: Any, recipe: Recipe, world: int) -> None:
    """Fill the DeepSpeed batch settings accelerate would take from prepared dataloaders (no-op without DeepSpeed)."""
    # DeepSpeed's "auto" values are filled by accelerate from prepared dataloaders; ctxext feeds its own
    # batches, so it fills them itself. Untested here (no GPU, no deepspeed): see configs/accelerate/.
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        return
    cfg = recipe.train
    if cfg.gradient_accumulation_steps > 1:
        raise InputError(
            "train.gradient_accumulation_steps: under DeepSpeed use 1 and raise train.micro_batch_size "
            "(DeepSpeed accumulates and scales gradients itself)"
        )
    ds = plugin.deepspeed_config
    ds["train_micro_batch_size_per_gpu"] = cfg.micro_batch_size
    ds["gradient_accumulation_steps"] = 1
    # DeepSpeed averages gradients over every process, those splitting a sequence included (the loss is scaled for it).
    ds["train_batch_size"] = cfg.micro_batch_size * world * cfg.sequence_parallel_size * cfg.context_parallel_size
    ds["gradient_clipping"] = cfg.max_grad_norm or 0.0
    ds.setdefault("bf16", {})["enabled"] = torch.cuda.is_available()
