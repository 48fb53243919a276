"""The training loop, top to bottom::

    micro-batches (deterministic order, sharded over processes) → chunked loss → backward
    → NaN/inf check → clip → step → log (console, metrics.jsonl, trackers) → validate → checkpoint

The loop works on one object, :class:`TrainingState` (transformers' ``TrainerState`` and the trainer's parts in
one): what :func:`ctxext.training.run.train` prepared, and where the run stands. A failure is written to
``run.json`` (``failed`` / ``interrupted``) before it is raised, with the way out.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ctxext.artifacts.run import resume_command
from ctxext.errors import CtxextError, InputError, Terminated, is_disk_full
from ctxext.recipe.schema import Recipe
from ctxext.training.checkpoints import Checkpoints, Counters, step_of
from ctxext.training.data.corpus import TrainingData
from ctxext.training.data.rows import IGNORE_INDEX, build_inputs
from ctxext.training.folder import METRICS_FILE, RunWriter
from ctxext.training.launch import Launch
from ctxext.training.losses import micro_batch_loss
from ctxext.training.model import TrainingModel
from ctxext.training.probe import Probe
from ctxext.training.sequence_parallel import split_rows
from ctxext.training.steps import micro_batches, peak_mem_mb, short_rows
from ctxext.training.stop import StopRequest

OOM_ADVICE = (
    "out of memory at train.seq_len={seq} with micro_batch_size={mb}. On a GPU keep the train.memory levers on "
    "(`ctxext plan` ranks what each buys). Lower, in this order: "
    "train.micro_batch_size (raise train.gradient_accumulation_steps to keep the batch), train.seq_len, "
    "train.loss_chunk_size, lora.r; keep train.gradient_checkpointing=true and quantization.mode=nf4; drop "
    "the embeddings (embeddings or embed_tokens) from lora.extra_trainable; or spread the sequence over GPUs: "
    "train.sequence_parallel_size "
    "(DeepSpeed Ulysses, docs/sequence-parallel.md) or FSDP2 and train.context_parallel_size "
    "(configs/accelerate/fsdp2.yaml)."
)
# Set to a folder, each process writes rank-N.json there: the blocks it trained on and a digest of its
# trained weights (how the multi-process test shows sharding and synchronisation). Off by default.
AUDIT_ENV = "CTXEXT_RANK_AUDIT"


class TrainingDiverged(CtxextError):
    """The loss or the gradient became NaN or infinite."""


@dataclass
class TrainingState:
    """A prepared run and where it stands: everything the loop reads and changes, in one object.

    Attributes:
        recipe: the recipe.
        launch: the accelerator and this process's place in the job.
        loaded: the training model (plan, attention implementation, parameter counts).
        data: the training (and held-out) blocks.
        model: the prepared :class:`~ctxext.training.steps.CausalLMWithChunkedLoss`.
        trainable: the trainable parameters (clipped).
        optimizer: the prepared optimizer.
        optimizer_name: its resolved name (for the first line of the log).
        scheduler: the learning-rate schedule.
        checkpoints: the run's checkpoints.
        writer: the run folder (its ``run.json`` record).
        stop: the run's stop signals (:mod:`ctxext.training.stop`); the loop stops at the next step boundary.
        counters: step and token counters (checkpointed; restored on resume).
        last_loss: the latest step's training loss.
        last_val: the latest held-out loss (``None`` before the first validation, or without a held-out split).
        consumed: the training blocks this process read, in order (the rank audit).
        probe: the adaptive stop (``train.probe``), or ``None``.
    """

    recipe: Recipe
    launch: Launch
    loaded: TrainingModel
    data: TrainingData
    model: Any
    trainable: list[torch.nn.Parameter]
    optimizer: Any
    optimizer_name: str
    scheduler: Any
    checkpoints: Checkpoints
    writer: RunWriter
    stop: StopRequest = field(default_factory=StopRequest)
    counters: Counters = field(default_factory=Counters)
    last_loss: float | None = None
    last_val: float | None = None
    consumed: list[int] = field(default_factory=list)
    probe: Probe | None = None

    @property
    def tokens_per_step(self) -> int:
        """Training tokens per optimizer step, over every data-parallel process."""
        cfg = self.recipe.train
        return cfg.gradient_accumulation_steps * cfg.micro_batch_size * self.recipe.seq_len * self.launch.world


class TrainingLoop:
    """The optimizer steps of a prepared run, from ``state.counters.step`` to ``train.max_steps``.

    Args:
        state: the prepared run (:class:`TrainingState`); the loop advances its counters and losses.
    """

    def __init__(self, state: TrainingState):
        self.state = state
        self.recipe, self.cfg, self.launch = state.recipe, state.recipe.train, state.launch
        self.acc, self.counters, self.writer = state.launch.accelerator, state.counters, state.writer

    def validate(self) -> float | None:
        """The mean next-token loss on the held-out blocks (``None`` without a validation split)."""
        st = self.state
        # Validation rows keep their plain positions (no PoSE): the loss at seq_len stays comparable across runs.
        data, acc, world, rank = st.data.validation, self.acc, self.launch.world, self.launch.rank
        if data is None:
            return None
        mb, split = self.cfg.micro_batch_size, self.launch.split
        n = min(len(data), self.cfg.eval_batches * mb * world)
        total = torch.zeros((), device=acc.device)
        count = torch.zeros((), device=acc.device)
        # Every process runs the same number of forward passes (DDP / FSDP forwards talk to each other);
        # a process without a block of its own re-reads block 0 and does not count it.
        rounds = math.ceil(n / (world * mb))
        st.model.eval()
        with torch.no_grad():
            for j in range(rounds):
                first = (j * world + rank) * mb
                if split.active:
                    rows, real = split_rows(data, first, n, mb)
                else:
                    rows = data[first : min(first + mb, n)] if first < n else data[0:1]
                inputs = build_inputs(rows, attn_implementation=st.loaded.attn_implementation)
                if split.active:
                    inputs.labels[real:] = IGNORE_INDEX  # filler rows: read, never scored
                with split.place(inputs.to(acc.device)) as inputs:
                    t, c = st.model(inputs.input_ids, inputs.labels, inputs.position_ids, inputs.attention_mask)
                if first < n:
                    total += t.float()
                    count += c
        st.model.train()
        total, count = acc.reduce(total, "sum"), acc.reduce(count, "sum")
        return float(total / count) if count > 0 else None

    def run(self) -> None:
        """Train to ``train.max_steps``, recording a failure in ``run.json`` before raising it.

        Raises:
            TrainingDiverged: NaN / inf loss or gradient.
            CtxextError: out of memory (with what to lower), or a stop signal (exit code 130 for Ctrl-C, 143 for
                SIGTERM; how to resume).
            InputError: the disk filled up (``run.json`` says ``interrupted``; how to resume).
        """
        st = self.state
        cfg, counters = self.cfg, self.counters
        self.acc.print(
            f"training {st.loaded.trainable_params:,} of {st.loaded.total_params:,} parameters "
            f"({cfg.mode}, {self.recipe.quantization.mode}, {st.loaded.attn_implementation}, {st.optimizer_name}) on "
            f"{self.acc.num_processes} process(es): {cfg.max_steps} steps × {st.tokens_per_step:,} tokens, "
            f"seq_len {self.recipe.seq_len}"
        )
        try:
            if cfg.eval_every and counters.step == 0:
                # The held-out loss before any training: the baseline every later val_loss is compared with.
                self.writer.update(initial_val_loss=self.validate())
            st.model.train()
            self._loop()
        except torch.OutOfMemoryError:
            self._failed("failed", "out of memory")
            raise CtxextError(OOM_ADVICE.format(seq=self.recipe.seq_len, mb=cfg.micro_batch_size)) from None
        except KeyboardInterrupt as exc:
            self._failed("interrupted", str(exc) or "interrupted")
            raise CtxextError(self._stopped_message(exc), exit_code=getattr(exc, "exit_code", 130)) from None
        except Exception as exc:
            if is_disk_full(exc):
                self._failed("interrupted", "disk full", quiet=True)
                raise InputError(self._disk_full_message(exc)) from None
            self._failed("failed", str(exc) or type(exc).__name__)
            # The CPU allocator reports exhaustion as a plain RuntimeError.
            if isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc):
                raise CtxextError(OOM_ADVICE.format(seq=self.recipe.seq_len, mb=cfg.micro_batch_size)) from None
            raise
        except BaseException as exc:
            self._failed("failed", str(exc) or type(exc).__name__)
            raise
        finally:
            write_rank_audit(self.acc.process_index, st.consumed)
        write_rank_audit(self.acc.process_index, st.consumed, st.model)

    def _where(self) -> str:
        """Where a resume starts: the last checkpoint, named."""
        good = self.state.checkpoints.saved()
        if good:
            return f"the last checkpoint is {good[-1]} (step {step_of(good[-1])})"
        return "no checkpoint was saved yet (train.save_every), so a resume starts from step 0"

    def _stopped_message(self, exc: KeyboardInterrupt) -> str:
        how = f"stopped by {exc}" if isinstance(exc, Terminated) and exc.signum != signal.SIGINT else "interrupted"
        return (
            f"{how} at step {self.counters.step} of {self.cfg.max_steps}; {self._where()}. Continue with "
            f"`{resume_command(self.writer.out)}`."
        )

    def _disk_full_message(self, exc: BaseException) -> str:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "no space left on device"
        return (
            f"output.dir {self.writer.out}: the disk filled up at step {self.counters.step} ({reason}); the run "
            f"is kept as interrupted and {self._where()}. Free some space, then continue with "
            f"`{resume_command(self.writer.out)}`."
        )

    def _stop_now(self) -> None:
        """A stop signal arrived: checkpoint the step just finished (unless saved already), then stop."""
        saved = self.state.checkpoints.saved()
        if self.counters.step > 0 and (not saved or step_of(saved[-1]) != self.counters.step):
            self.state.checkpoints.save(self.counters.step)
        raise Terminated(self.state.stop.signum or signal.SIGTERM)

    def _failed(self, status: str, error: str, quiet: bool = False) -> None:
        try:
            self.writer.update(
                status=status, steps=self.counters.step, tokens_seen=self.counters.tokens_seen, error=error
            )
        except OSError:
            if not quiet:  # on a full disk even run.json may not fit: the message still says how to resume
                raise

    def _loop(self) -> None:
        from ctxext.progress import progress

        st = self.state
        cfg, counters, main = self.cfg, self.counters, self.launch.main
        ga, mb = cfg.gradient_accumulation_steps, cfg.micro_batch_size
        world, rank = self.launch.world, self.launch.rank
        short = short_rows(st.data.train, st.loaded.model)  # length-dependent RoPE: short rows apart
        batches = micro_batches(len(st.data.train), mb, world, rank, cfg.seed, start=counters.step * ga, short=short)
        if short is not None and 0 < sum(short) < len(short):
            self.acc.print(
                f"mixed context windows: {sum(short)} of {len(short)} rows stay within the original window; they "
                "train in micro-batches of their own, on the short-context RoPE"
            )
        # Without a terminal (a log file, a scheduler) a plain line every log_every steps, but no more than about
        # 20 lines a run (a log is read line by line; metrics.jsonl keeps every step).
        every = max(cfg.log_every, cfg.max_steps // 20)
        shown = progress("train", cfg.max_steps, enabled=main, unit="step", every=every, completed=counters.step)
        if st.probe is not None:
            st.probe.state.start_clock()
            if st.probe.state.stopped:  # resumed from a checkpoint written after the probe stopped the run
                return
        metrics = open(self.writer.out / METRICS_FILE, "a") if main else nullcontext()  # noqa: SIM115
        with metrics as metrics_file, shown as tracker:
            while counters.step < cfg.max_steps:
                if st.stop.pending(self.acc):
                    self._stop_now()
                record = self._step(batches)
                if metrics_file is not None and (counters.step % cfg.log_every == 0 or "val_loss" in record):
                    metrics_file.write(json.dumps(record) + "\n")
                    metrics_file.flush()
                if cfg.tracker != "none":
                    self.acc.log({k: v for k, v in record.items() if k != "step"}, step=counters.step)
                info = f"loss {st.last_loss:.4f} lr {record['lr']:.2e} {record['tokens_per_sec']:,.0f} tok/s"
                if st.last_val is not None:
                    info += f" val {st.last_val:.4f}"
                tracker.update(counters.step, info=info)
                if st.probe is not None and st.probe.due(counters.step) and self._probe(st.probe):
                    break
                if cfg.save_every and counters.step % cfg.save_every == 0 and counters.step < cfg.max_steps:
                    st.checkpoints.save(counters.step)

    def _probe(self, probe: Probe) -> bool:
        """Run the adaptive stop's probe after this step; write its curve; returns whether the run stops here."""
        stop = probe.run(self.counters.step, self.state.model)
        probe.state.tick()
        if self.launch.main:
            probe.write_curve(self.writer.out, self.counters.step)
        return stop

    def _step(self, batches: Any) -> dict[str, Any]:
        """One optimizer step (``ga`` micro-batches); returns its metrics record."""
        st = self.state
        cfg, counters, acc, launch = self.cfg, self.counters, self.acc, self.launch
        ga, mb, plan = cfg.gradient_accumulation_steps, cfg.micro_batch_size, st.loaded.plan
        t0 = time.perf_counter()
        step_loss = torch.zeros((), device=acc.device)
        # The logged loss: the mean over the step's scored tokens (the backward weighs them by micro_batch_loss).
        scored = torch.zeros((), device=acc.device)
        scored_total = torch.zeros((), device=acc.device)
        for micro in range(ga):
            idx = next(batches)
            st.consumed.extend(idx)
            inputs = build_inputs(
                st.data.train[idx],
                attn_implementation=st.loaded.attn_implementation,
                target_length=plan.target_length if plan else None,
                pose_chunks=cfg.pose.chunks if cfg.pose else None,
                pose_sampling=cfg.pose.sampling if cfg.pose else "official",
                seed=cfg.seed,
                first_example=((counters.step * ga + micro) * launch.world + launch.rank) * mb,
            )
            sync = acc.no_sync(st.model) if micro < ga - 1 else nullcontext()
            # This process's share of the rows under a split (a ring keeps its attention patched for the backward).
            with sync, launch.split.place(inputs.to(acc.device)) as inputs:
                total, count = st.model(inputs.input_ids, inputs.labels, inputs.position_ids, inputs.attention_mask)
                # Under a sequence split the labels are this process's shard: the same rule is exact there too.
                loss = micro_batch_loss(total, inputs.labels, ga)
                acc.backward(loss)
            step_loss += loss.detach()
            scored_total += total.detach().float()
            scored += count
        grad_norm = acc.clip_grad_norm_(st.trainable, cfg.max_grad_norm) if cfg.max_grad_norm else None
        self._check_finite(step_loss, grad_norm)
        st.optimizer.step()
        st.scheduler.step()
        st.optimizer.zero_grad(set_to_none=True)
        counters.step += 1
        counters.tokens_seen += st.tokens_per_step
        st.last_loss = (acc.reduce(scored_total, "sum") / acc.reduce(scored, "sum").clamp(min=1)).item()
        dt = time.perf_counter() - t0
        record = {
            "step": counters.step,
            "loss": st.last_loss,
            "lr": st.scheduler.get_last_lr()[0],
            "tokens_per_sec": st.tokens_per_step / dt,
            "peak_mem_mb": peak_mem_mb(acc.device),
            "tokens_seen": counters.tokens_seen,
        }
        if grad_norm is not None:
            record["grad_norm"] = float(grad_norm)
        if cfg.eval_every and (counters.step % cfg.eval_every == 0 or counters.step == cfg.max_steps):
            st.last_val = self.validate()
            if st.last_val is not None:
                record["val_loss"] = st.last_val
        return record

    def _check_finite(self, step_loss: torch.Tensor, grad_norm: torch.Tensor | None) -> None:
        # Every process must agree to stop, or the others would wait forever in the next all-reduce.
        bad = torch.tensor(
            float(not torch.isfinite(step_loss) or (grad_norm is not None and not torch.isfinite(grad_norm))),
            device=self.acc.device,
        )
        if self.acc.reduce(bad, "sum").item() > 0:
            good = self.state.checkpoints.saved()
            raise TrainingDiverged(
                f"the loss became {step_loss.item()} at step {self.counters.step + 1} (gradient norm "
                f"{float(grad_norm) if grad_norm is not None else 'n/a'}): training stopped. "
                + (f"The last good checkpoint is {good[-1]}; " if good else "No checkpoint was saved yet; ")
                + "lower train.learning_rate, raise train.warmup_steps or set train.max_grad_norm, then "
                "resume with --resume (or start over)."
            )


def write_rank_audit(process_index: int, blocks: list[int], model: torch.nn.Module | None = None) -> None:
    """With ``$CTXEXT_RANK_AUDIT`` set, write this process's ``rank-N.json`` there (see :data:`AUDIT_ENV`).

    Args:
        process_index: this process.
        blocks: the training blocks it consumed, in order.
        model: the trained model, once training ended (adds ``trainable_sha256``).
    """
    folder = os.environ.get(AUDIT_ENV)
    if not folder:
        return
    record: dict[str, Any] = {"blocks": blocks}
    if model is not None:
        record["trainable_sha256"] = _trainable_digest(model)
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"rank-{process_index}.json").write_text(json.dumps(record))


def _trainable_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the trainable weights, so processes can show they hold the same model."""
    import hashlib

    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        if param.requires_grad:
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
