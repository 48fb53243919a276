"""``ctxext train``: QLoRA long-document fine-tuning of a RoPE-patched model, under accelerate.

One readable loop, top to bottom::

    recipe → run folder → accelerator (+ launch check) → model: load, patch RoPE, quantize, LoRA
    → data: tokenize, pack, hold out → optimizer + schedule → resume? → loop:
        micro-batches (deterministic order, sharded over processes) → chunked loss → backward
        → NaN/inf check → clip → step → log (console, metrics.jsonl, trackers) → validate → checkpoint
    → write adapter, patched config, tokenizer, recipe, versions → run.json "complete" (written last)
    → optional eval suite and Hub push

Resuming is exact: the data order is a pure function of (seed, epoch), so a resumed run skips exactly
the micro-batches already consumed, and accelerate restores the trainable weights, optimizer,
scheduler and RNG states. A run interrupted at any point ends with the same adapter as an
uninterrupted one.

A run folder is complete iff its ``run.json`` says ``"status": "complete"``; everything else in it is
written before that file.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import platform
import resource
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ctxext.atomic import check_output
from ctxext.config import Recipe, dump_recipe
from ctxext.errors import CtxextError, InputError
from ctxext.losses import chunked_cross_entropy
from ctxext.rows import build_inputs, shifted_labels
from ctxext.runfolder import RUN_FILE, read_run
from ctxext.sources import resolve_model_path
from ctxext.weights import check_fingerprint, check_weights_readable, fingerprint

__all__ = ["CausalLMWithChunkedLoss", "TrainResult", "micro_batches", "shifted_labels", "train"]

METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
_OOM_ADVICE = (
    "out of memory at train.seq_len={seq} with micro_batch_size={mb}. Lower, in this order: "
    "train.micro_batch_size (raise train.gradient_accumulation_steps to keep the batch), train.seq_len, "
    "train.loss_chunk_size, lora.r; keep train.gradient_checkpointing=true and quantization.mode=nf4; drop "
    "embed_tokens from lora.extra_trainable; or spread the sequence over GPUs with FSDP2 and "
    "train.context_parallel_size (configs/accelerate/fsdp2.yaml)."
)


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        run_dir: the complete run folder.
        model: the trained peft model (unwrapped, eval mode) on the main process, else ``None``.
        run: the ``run.json`` record.
    """

    run_dir: Path
    model: Any
    run: dict[str, Any]


class TrainingDiverged(CtxextError):
    """The loss or the gradient became NaN or infinite."""


# ---------------------------------------------------------------------------------------------
# Run folder helpers
# ---------------------------------------------------------------------------------------------


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _versions(recipe: Recipe, command: list[str]) -> dict[str, Any]:
    import importlib.metadata as md

    libs: dict[str, str | None] = {}
    for name in ("ctxext", "torch", "transformers", "peft", "bitsandbytes", "accelerate", "datasets", "tokenizers"):
        try:
            libs[name] = md.version(name)
        except md.PackageNotFoundError:
            libs[name] = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "libraries": libs,
        "seed": recipe.train.seed,
        "command": command,
    }


def _peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # The process's peak resident memory (Linux reports KiB).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------------------------
# Pieces of the loop
# ---------------------------------------------------------------------------------------------


class CausalLMWithChunkedLoss(torch.nn.Module):
    """Wraps a peft causal LM so that its forward returns the chunked loss, not logits.

    The wrapper is what accelerate prepares (DDP / FSDP): the loss has to be computed inside the
    wrapped module's forward for gradient synchronisation to see it.
    """

    def __init__(self, peft_model: Any, chunk_size: int):
        super().__init__()
        self.peft_model = peft_model
        self.chunk_size = chunk_size

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed next-token loss and the number of scored tokens (``labels`` are already shifted).

        ``position_ids`` / ``attention_mask`` come from :func:`ctxext.rows.build_inputs` (PoSE, packed
        documents); ``None`` is the model's default causal path.
        """
        base = self.peft_model.get_base_model()
        hidden = base.base_model(
            input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        head = base.get_output_embeddings()
        total = chunked_cross_entropy(
            hidden, head.weight, labels, bias=head.bias, chunk_size=self.chunk_size, reduction="sum"
        )
        return total, (labels != -100).sum()


def micro_batches(
    n_blocks: int, micro_batch_size: int, world: int, rank: int, seed: int, start: int = 0
) -> Iterator[list[int]]:
    """The block indices of this process's micro-batches, forever, from micro-batch number ``start``.

    Epoch ``e`` visits the blocks in ``randperm(seed + e)`` order; global micro-batch ``k`` of an
    epoch goes to process ``k % world``. The order depends on nothing else, so skipping ``start``
    micro-batches on resume is exact.

    Args:
        n_blocks: training blocks.
        micro_batch_size: blocks per micro-batch.
        world: data-parallel processes.
        rank: this process's data-parallel rank.
        seed: the recipe seed.
        start: micro-batches of this process already consumed.

    Yields:
        Lists of ``micro_batch_size`` block indices.
    """
    per_epoch = n_blocks // (micro_batch_size * world)
    if per_epoch == 0:
        raise InputError(
            f"data: {n_blocks} training blocks cannot fill one micro-batch of {micro_batch_size} on each of "
            f"{world} processes; add data or lower train.micro_batch_size / train.seq_len"
        )
    k = start
    epoch, perm = -1, []
    while True:
        e, i = divmod(k, per_epoch)
        if e != epoch:
            epoch = e
            perm = torch.randperm(n_blocks, generator=torch.Generator().manual_seed(seed + e)).tolist()
        first = (i * world + rank) * micro_batch_size
        yield perm[first : first + micro_batch_size]
        k += 1


class _Counters:
    """Step and token counters, checkpointed with the accelerate state."""

    def __init__(self) -> None:
        self.step = 0
        self.tokens_seen = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "tokens_seen": self.tokens_seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])
        self.tokens_seen = int(state["tokens_seen"])


def _make_optimizer(recipe: Recipe, params: list[torch.nn.Parameter], device: torch.device):
    name = recipe.train.optimizer
    if name == "auto":
        name = "paged_adamw_8bit" if device.type == "cuda" else "adamw"
    kwargs: dict[str, Any] = {"lr": recipe.train.learning_rate, "weight_decay": recipe.train.weight_decay}
    if name == "paged_adamw_8bit":
        if device.type != "cuda":
            raise InputError("train.optimizer: paged_adamw_8bit pages optimizer state through CUDA; use adamw on CPU")
        import bitsandbytes as bnb

        return bnb.optim.PagedAdamW8bit(params, **kwargs), name
    return torch.optim.AdamW(params, **kwargs), name


def _check_launch(accelerator: Any, recipe: Recipe) -> None:
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
    tracker_module = {"tensorboard": "tensorboard", "wandb": "wandb"}.get(recipe.train.tracker)
    if tracker_module and importlib.util.find_spec(tracker_module) is None:
        raise InputError(f"train.tracker: {recipe.train.tracker} is not installed; pip install {tracker_module}")
    if recipe.train.context_parallel_size > 1 and not torch.cuda.is_available():
        raise InputError(
            "train.context_parallel_size: accelerate's context parallelism needs CUDA with FSDP2; set it to 1 here"
        )


def _configure_deepspeed(accelerator: Any, recipe: Recipe, world: int) -> None:
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
    ds["train_batch_size"] = cfg.micro_batch_size * world
    ds["gradient_clipping"] = cfg.max_grad_norm or 0.0
    ds.setdefault("bf16", {})["enabled"] = torch.cuda.is_available()


def _validation_loss(
    model: Any, data: Any, recipe: Recipe, accelerator: Any, world: int, rank: int, attn: str = "sdpa"
) -> float | None:
    # Validation rows keep their plain positions (no PoSE): the loss at seq_len stays comparable across runs.
    if data is None:
        return None
    mb = recipe.train.micro_batch_size
    n = min(len(data), recipe.train.eval_batches * mb * world)
    total = torch.zeros((), device=accelerator.device)
    count = torch.zeros((), device=accelerator.device)
    # Every process runs the same number of forward passes (DDP / FSDP forwards talk to each other);
    # a process without a block of its own re-reads block 0 and does not count it.
    rounds = math.ceil(n / (world * mb))
    model.eval()
    with torch.no_grad():
        for j in range(rounds):
            first = (j * world + rank) * mb
            rows = data[first : min(first + mb, n)] if first < n else data[0:1]
            inputs = build_inputs(rows, attn_implementation=attn).to(accelerator.device)
            t, c = model(inputs.input_ids, inputs.labels, inputs.position_ids, inputs.attention_mask)
            if first < n:
                total += t.float()
                count += c
    model.train()
    total, count = accelerator.reduce(total, "sum"), accelerator.reduce(count, "sum")
    return float(total / count) if count > 0 else None


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def train(recipe: Recipe, resume: bool = False, command: list[str] | None = None) -> TrainResult:
    """Run a training recipe to completion and return its run folder.

    Args:
        recipe: a validated recipe.
        resume: continue the run in ``output.dir`` from its last checkpoint.
        command: the command line, recorded in ``versions.json``.

    Returns:
        A :class:`TrainResult` (the complete run folder, the trained model).

    Raises:
        InputError: an output folder in the way, bad data, a recipe that differs from the run's on resume.
        TrainingDiverged: NaN / inf loss; the last good checkpoint is kept for ``--resume``.
        CtxextError: out of memory, or a bad multi-process launch.
    """
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, set_seed

    cfg = recipe.train
    out = Path(recipe.output.dir)
    command = command or sys.argv

    # --- accelerator and launch check --------------------------------------------------------
    acc_kwargs: dict[str, Any] = {"dataloader_config": DataLoaderConfiguration(split_batches=False)}
    if cfg.tracker != "none":
        acc_kwargs.update(log_with=cfg.tracker, project_dir=str(out / "logs"))
    if cfg.context_parallel_size > 1 and torch.cuda.is_available():
        from accelerate import ParallelismConfig

        acc_kwargs["parallelism_config"] = ParallelismConfig(cp_size=cfg.context_parallel_size)
    accelerator = Accelerator(**acc_kwargs)
    _check_launch(accelerator, recipe)
    main = accelerator.is_main_process
    cp = cfg.context_parallel_size if "parallelism_config" in acc_kwargs else 1
    world, rank = accelerator.num_processes // cp, accelerator.process_index // cp

    # --- run folder -----------------------------------------------------------------------------
    recipe_text = dump_recipe(recipe)
    run_file = out / RUN_FILE
    if resume:
        if not run_file.is_file():
            raise InputError(f"--resume: {out} holds no run to resume (no {RUN_FILE}); drop --resume to start one")
        previous = read_run(out, allow_incomplete=True)
        if previous.get("status") == "complete":
            raise InputError(f"--resume: the run in {out} is already complete")
        saved = (out / "recipe.yaml").read_text() if (out / "recipe.yaml").is_file() else None
        if saved is not None and saved != recipe_text:
            import yaml

            old, new = _flat_keys(yaml.safe_load(saved)), _flat_keys(yaml.safe_load(recipe_text))
            diffs = [
                f"{k}: {old.get(k)!r} → {new.get(k)!r}"
                for k in set(old) | set(new)
                # A run folder may be moved: its new place is not a change of recipe.
                if old.get(k) != new.get(k) and k != "output.dir"
            ]
            if diffs:
                raise InputError(
                    "--resume: the recipe differs from the run's recipe.yaml (" + "; ".join(sorted(diffs)) + "); "
                    f"resume with the same recipe and overrides: `ctxext train {out}/recipe.yaml output.dir={out} "
                    "--resume`"
                )
    elif out.exists() and out.is_dir() and any(out.iterdir()):
        hint = "pass --resume to continue it, or " if run_file.is_file() else ""
        raise InputError(f"output.dir: {out} already exists and is not empty; {hint}choose another output.dir")
    else:
        check_output(out, "run", overwrite=False, flag="output.dir")
    base_dir = resolve_model_path(recipe.model.path, recipe.model.revision)
    check_weights_readable(base_dir)
    base_fingerprint = fingerprint(base_dir)
    if resume:
        check_fingerprint(base_dir, previous.get("base_fingerprint"), "--resume")

    # --- model: load → patch RoPE → quantize → LoRA --------------------------------------------
    set_seed(cfg.seed)
    from accelerate.utils import DistributedType

    from ctxext.model import build_training_model

    loaded = build_training_model(
        recipe, accelerator.device, sharded=accelerator.distributed_type == DistributedType.FSDP
    )
    plan = loaded.plan
    run: dict[str, Any] = dict(
        status="running",
        base_model=recipe.model.path,
        base_model_resolved=str(loaded.base_path),
        base_fingerprint=base_fingerprint,
        rope_parameters=plan.rope_parameters if plan else dict(loaded.model.config.rope_parameters or {}),
        original_length=plan.original_length if plan else None,
        target_length=plan.target_length if plan else None,
        method=recipe.rope.method,
        lora={
            "r": recipe.lora.r,
            "alpha": recipe.lora.alpha,
            "dropout": recipe.lora.dropout,
            "target_modules": list(recipe.lora.target_modules),
        },
        extra_trainable=loaded.extra_trainable,
        trainable_params=loaded.trainable_params,
        attn_implementation=loaded.attn_implementation,
        compute_dtype=str(loaded.compute_dtype).replace("torch.", ""),
        seq_len=recipe.seq_len,
        quantization=recipe.quantization.mode,
        num_processes=accelerator.num_processes,
        steps=0,
        tokens_seen=0,
        final_train_loss=None,
        final_val_loss=None,
        initial_val_loss=previous.get("initial_val_loss") if resume else None,
    )

    # --- data ---------------------------------------------------------------------------------
    from ctxext.mixture import prepare_training_data

    with accelerator.main_process_first():  # the main process tokenizes; the others read the datasets cache
        rows = cfg.max_steps * cfg.gradient_accumulation_steps * cfg.micro_batch_size * world
        data = prepare_training_data(recipe, loaded.tokenizer, plan, rows)
    accelerator.print(f"data: {data.summary}")
    # Too little data for one micro-batch is bad input: say so before the run folder exists.
    next(micro_batches(len(data.train), cfg.micro_batch_size, world, rank, cfg.seed))
    if cp > 1 and (cfg.pose or recipe.data.document_mask or recipe.data.short_fraction):
        raise InputError("train.context_parallel_size: PoSE, data.document_mask and data.short_fraction need 1")

    # --- the run folder: created only once the model and the data are known to be usable -------------
    accelerator.wait_for_everyone()
    if main:
        (out / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
        (out / "recipe.yaml").write_text(recipe_text)
        _write_json_atomic(out / "versions.json", _versions(recipe, command))
        if data.mixture is not None:
            _write_json_atomic(out / "mixture.json", data.mixture)
    if data.mixture is not None:
        run["mixture"] = data.mixture["realised"]

    def write_run(**changes: Any) -> None:
        run.update(changes)
        if main:
            _write_json_atomic(run_file, run)

    write_run()

    # --- optimizer, schedule, accelerate ----------------------------------------------------------
    from transformers import get_scheduler

    model = CausalLMWithChunkedLoss(loaded.model, cfg.loss_chunk_size)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer, optimizer_name = _make_optimizer(recipe, trainable, accelerator.device)
    scheduler = get_scheduler(
        {"constant": "constant_with_warmup"}.get(cfg.scheduler, cfg.scheduler),
        optimizer,
        num_warmup_steps=cfg.warmup_steps,
        num_training_steps=cfg.max_steps,
    )
    _configure_deepspeed(accelerator, recipe, world)
    model, optimizer = accelerator.prepare(model, optimizer)
    counters = _Counters()
    # The scheduler is stepped by hand once per optimizer step (accelerate would step it once per process).
    accelerator.register_for_checkpointing(scheduler, counters)
    trainable_keys = {n for n, p in model.named_parameters() if p.requires_grad}

    def keep_trainable(models: list, weights: list, output_dir: str) -> None:
        # Checkpoints hold only the trained weights: the frozen (4-bit) base is the same at every step.
        for i, state in enumerate(weights):
            weights[i] = {k: v for k, v in state.items() if k in trainable_keys}

    accelerator.register_save_state_pre_hook(keep_trainable)
    if cfg.tracker != "none":
        accelerator.init_trackers(out.name or "ctxext", config=_flat_config(recipe))

    # --- resume ---------------------------------------------------------------------------------
    ckpt_root = out / CHECKPOINTS
    if resume:
        ckpts = sorted(ckpt_root.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
        if ckpts:
            try:
                accelerator.load_state(str(ckpts[-1]), strict=False)
            except Exception as exc:  # torch / safetensors / accelerate raise many types for a damaged file
                earlier = f"; the one before it is {ckpts[-2]}" if len(ckpts) > 1 else ""
                raise InputError(
                    f"--resume: checkpoint {ckpts[-1]} cannot be loaded ({type(exc).__name__}: "
                    f"{str(exc).strip()[:200] or 'damaged'}). Move that folder away to resume from the previous "
                    f"checkpoint{earlier}, or start over in a new output.dir."
                ) from None
            accelerator.print(f"resumed from {ckpts[-1]} (step {counters.step})")
        else:
            accelerator.print(f"no checkpoint in {ckpt_root} yet: starting from step 0")
            if main and (out / METRICS_FILE).exists():
                (out / METRICS_FILE).unlink()
    if main and (out / METRICS_FILE).exists():
        # Drop metrics logged after the checkpoint we resume from, so the file reads as one run.
        lines = [ln for ln in (out / METRICS_FILE).read_text().splitlines() if ln.strip()]
        kept = [ln for ln in lines if json.loads(ln)["step"] <= counters.step]
        (out / METRICS_FILE).write_text("".join(ln + "\n" for ln in kept))

    def save_checkpoint() -> None:
        final = ckpt_root / f"step-{counters.step:07d}"
        tmp = ckpt_root / f".tmp-step-{counters.step:07d}"
        if main and tmp.exists():
            shutil.rmtree(tmp)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()
        if main:
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)  # a checkpoint folder that exists is whole
            old = sorted(ckpt_root.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
            for stale in old[: -cfg.keep_checkpoints]:
                shutil.rmtree(stale, ignore_errors=True)
        accelerator.wait_for_everyone()

    # --- the loop ---------------------------------------------------------------------------------
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    ga, mb, seq = cfg.gradient_accumulation_steps, cfg.micro_batch_size, recipe.seq_len
    tokens_per_step = ga * mb * seq * world
    batches = micro_batches(len(data.train), mb, world, rank, cfg.seed, start=counters.step * ga)
    consumed: list[int] = []
    metrics_file = open(out / METRICS_FILE, "a") if main else None  # noqa: SIM115 - closed in finally
    last_loss = last_val = None
    progress = Progress(
        TextColumn("[bold]train[/]"),
        BarColumn(),
        TextColumn("step {task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=None,
        disable=not main,
    )
    accelerator.print(
        f"training {loaded.trainable_params:,} of {loaded.total_params:,} parameters "
        f"({recipe.quantization.mode}, {loaded.attn_implementation}, {optimizer_name}) on {accelerator.num_processes} "
        f"process(es): {cfg.max_steps} steps × {tokens_per_step:,} tokens, seq_len {seq}"
    )
    if cfg.eval_every and counters.step == 0:
        # The held-out loss before any training: the baseline every later val_loss is compared with.
        initial_val = _validation_loss(
            model, data.validation, recipe, accelerator, world, rank, loaded.attn_implementation
        )
        write_run(initial_val_loss=initial_val)
    model.train()
    try:
        with progress:
            task = progress.add_task("train", total=cfg.max_steps, completed=counters.step, info="")
            while counters.step < cfg.max_steps:
                t0 = time.perf_counter()
                step_loss = torch.zeros((), device=accelerator.device)
                for micro in range(ga):
                    idx = next(batches)
                    consumed.extend(idx)
                    inputs = build_inputs(
                        data.train[idx],
                        attn_implementation=loaded.attn_implementation,
                        target_length=plan.target_length if plan else None,
                        pose_chunks=cfg.pose.chunks if cfg.pose else None,
                        seed=cfg.seed,
                        first_example=((counters.step * ga + micro) * world + rank) * mb,
                    ).to(accelerator.device)
                    ids, labels = inputs.input_ids, inputs.labels
                    sync = accelerator.no_sync(model) if micro < ga - 1 else nullcontext()
                    cp_ctx = (
                        accelerator.maybe_context_parallel(
                            buffers=[ids, labels], buffer_seq_dims=[1, 1], no_restore_buffers={ids, labels}
                        )
                        if cp > 1
                        else nullcontext()
                    )
                    with sync, cp_ctx:
                        total, count = model(ids, labels, inputs.position_ids, inputs.attention_mask)
                        loss = total / count.clamp(min=1) / ga
                        accelerator.backward(loss)
                    step_loss += loss.detach()
                grad_norm = accelerator.clip_grad_norm_(trainable, cfg.max_grad_norm) if cfg.max_grad_norm else None
                # Every process must agree to stop, or the others would wait forever in the next all-reduce.
                bad = torch.tensor(
                    float(not torch.isfinite(step_loss) or (grad_norm is not None and not torch.isfinite(grad_norm))),
                    device=accelerator.device,
                )
                if accelerator.reduce(bad, "sum").item() > 0:
                    good = sorted(ckpt_root.glob("step-*"))
                    raise TrainingDiverged(
                        f"the loss became {step_loss.item()} at step {counters.step + 1} (gradient norm "
                        f"{float(grad_norm) if grad_norm is not None else 'n/a'}): training stopped. "
                        + (f"The last good checkpoint is {good[-1]}; " if good else "No checkpoint was saved yet; ")
                        + "lower train.learning_rate, raise train.warmup_steps or set train.max_grad_norm, then "
                        "resume with --resume (or start over)."
                    )
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                counters.step += 1
                counters.tokens_seen += tokens_per_step
                last_loss = accelerator.reduce(step_loss, "mean").item()
                dt = time.perf_counter() - t0
                lr = scheduler.get_last_lr()[0]
                record = {
                    "step": counters.step,
                    "loss": last_loss,
                    "lr": lr,
                    "tokens_per_sec": tokens_per_step / dt,
                    "peak_mem_mb": _peak_mem_mb(accelerator.device),
                    "tokens_seen": counters.tokens_seen,
                }
                if grad_norm is not None:
                    record["grad_norm"] = float(grad_norm)
                if cfg.eval_every and (counters.step % cfg.eval_every == 0 or counters.step == cfg.max_steps):
                    last_val = _validation_loss(
                        model, data.validation, recipe, accelerator, world, rank, loaded.attn_implementation
                    )
                    if last_val is not None:
                        record["val_loss"] = last_val
                if metrics_file is not None and (counters.step % cfg.log_every == 0 or "val_loss" in record):
                    metrics_file.write(json.dumps(record) + "\n")
                    metrics_file.flush()
                if cfg.tracker != "none":
                    accelerator.log({k: v for k, v in record.items() if k != "step"}, step=counters.step)
                info = f"loss {last_loss:.4f} lr {lr:.2e} {record['tokens_per_sec']:,.0f} tok/s"
                if last_val is not None:
                    info += f" val {last_val:.4f}"
                progress.update(task, completed=counters.step, info=info)
                if cfg.save_every and counters.step % cfg.save_every == 0 and counters.step < cfg.max_steps:
                    save_checkpoint()
    except torch.OutOfMemoryError:
        write_run(status="failed", steps=counters.step, tokens_seen=counters.tokens_seen, error="out of memory")
        raise CtxextError(_OOM_ADVICE.format(seq=seq, mb=mb)) from None
    except RuntimeError as exc:
        # The CPU allocator reports exhaustion as a plain RuntimeError.
        write_run(status="failed", steps=counters.step, tokens_seen=counters.tokens_seen, error=str(exc))
        if "can't allocate memory" in str(exc):
            raise CtxextError(_OOM_ADVICE.format(seq=seq, mb=mb)) from None
        raise
    except KeyboardInterrupt:
        write_run(status="interrupted", steps=counters.step, tokens_seen=counters.tokens_seen, error="interrupted")
        good = sorted(ckpt_root.glob("step-*"))
        where = (
            f"the last checkpoint is {good[-1]} (step {int(good[-1].name.split('-')[1])})"
            if good
            else "no checkpoint was saved yet (train.save_every), so a resume starts from step 0"
        )
        raise CtxextError(
            f"interrupted at step {counters.step} of {cfg.max_steps}; {where}. Continue with "
            f"`ctxext train {out}/recipe.yaml output.dir={out} --resume`.",
            exit_code=130,
        ) from None
    except BaseException as exc:
        write_run(
            status="failed", steps=counters.step, tokens_seen=counters.tokens_seen, error=str(exc) or type(exc).__name__
        )
        raise
    finally:
        if metrics_file:
            metrics_file.close()
        # Which blocks this process trained on (an audit trail; the DDP test checks the sharding).
        ranks_dir = out / "ranks"
        ranks_dir.mkdir(exist_ok=True)
        (ranks_dir / f"rank-{accelerator.process_index}.json").write_text(json.dumps({"blocks": consumed}))

    # --- final validation, then the run folder -----------------------------------------------------
    (ranks_dir / f"rank-{accelerator.process_index}.json").write_text(
        json.dumps({"blocks": consumed, "trainable_sha256": _trainable_digest(model)})
    )
    if last_val is None:
        last_val = _validation_loss(
            model, data.validation, recipe, accelerator, world, rank, loaded.attn_implementation
        )
    state_dict = accelerator.get_state_dict(model)
    accelerator.wait_for_everyone()
    if main:
        _write_outputs(out, accelerator.unwrap_model(model).peft_model, state_dict, loaded, plan)
        write_run(
            status="complete",
            steps=counters.step,
            tokens_seen=counters.tokens_seen,
            final_train_loss=last_loss,
            final_val_loss=last_val,
            error=None,
        )
    accelerator.wait_for_everyone()
    if cfg.tracker != "none":
        accelerator.end_training()
    accelerator.print(f"run complete: {out} (train loss {last_loss:.4f}, val loss {last_val})")
    unwrapped = accelerator.unwrap_model(model).peft_model.eval() if main else None
    return TrainResult(run_dir=out, model=unwrapped, run=dict(run))


def _flat_keys(data: Any) -> dict[str, Any]:
    """``section.key`` → value of a recipe dict (sections may be null or scalars)."""
    flat: dict[str, Any] = {}
    for section, fields in (data or {}).items():
        if isinstance(fields, dict):
            flat.update({f"{section}.{key}": value for key, value in fields.items()})
        else:
            flat[section] = fields
    return flat


def _flat_config(recipe: Recipe) -> dict[str, Any]:
    """The recipe as flat ``section.key`` scalars: trackers (tensorboard hparams) take nothing nested."""
    flat = _flat_keys(json.loads(recipe.model_dump_json()))
    return {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v) for k, v in flat.items()}


def _trainable_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the trainable weights, so processes can show they hold the same model."""
    import hashlib

    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        if param.requires_grad:
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _write_outputs(out: Path, peft_model: Any, state_dict: dict, loaded: Any, plan: Any) -> None:
    """Adapter, patched config, tokenizer: staged in a hidden folder, then moved in."""
    from transformers import AutoConfig

    from ctxext.rope import apply_plan

    stage = out / ".final-tmp"
    if stage.exists():
        shutil.rmtree(stage)
    prefix = "peft_model."
    peft_state = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    peft_model.save_pretrained(stage, state_dict=peft_state)
    # The base config as it was on disk, plus the RoPE plan: no quantization settings, no use_cache=False.
    config = AutoConfig.from_pretrained(loaded.base_path)
    if plan is not None:
        apply_plan(config, plan)
    config.save_pretrained(stage)
    if plan is not None:
        from ctxext.rope import runtime_model_from_config, verify_against_plan

        # The run's config.json is what merge and eval load: reloaded from disk, it must be the plan.
        verify_against_plan(runtime_model_from_config(AutoConfig.from_pretrained(stage)), plan)
    loaded.tokenizer.save_pretrained(stage)
    for item in stage.iterdir():
        target = out / item.name
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(item, target)
    stage.rmdir()


def run_summary(run_dir: str | Path) -> str:
    """A one-line summary of a complete run, for messages."""
    run = read_run(run_dir)
    return (
        f"{run['base_model']} {run['method']} {run.get('original_length')}→{run.get('target_length')}, "
        f"{run['steps']} steps, train loss {run['final_train_loss']:.4f}, "
        f"val loss {run['final_val_loss'] if run['final_val_loss'] is not None else math.nan:.4f}"
    )
