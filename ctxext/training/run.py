"""``ctxext train``: QLoRA long-document fine-tuning of a RoPE-patched model, under accelerate.

One readable run, top to bottom (:func:`train`; the pieces live in :mod:`ctxext.training`)::

    recipe → accelerator (+ launch check) → run folder checked (new, or resume) → model: load, patch RoPE,
    quantize, LoRA → data: tokenize, pack, hold out → run folder created → optimizer + schedule → resume?
    → the loop (:mod:`ctxext.training.loop`) → final validation → adapter, patched config, tokenizer
    → run.json "complete" (written last)

Resuming is exact: the data order is a pure function of (seed, epoch), so a resumed run skips exactly
the micro-batches already consumed, and accelerate restores the trainable weights, optimizer,
scheduler and RNG states. A run interrupted at any point ends with the same adapter as an
uninterrupted one.

A run folder is complete iff its ``run.json`` says ``"status": "complete"``; everything else in it is
written before that file. Running the eval suite and pushing to the Hub after training is the CLI's job.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxext.artifacts.run import read_run
from ctxext.artifacts.run_record import ProbeRecord, RunRecord, TopologyRecord
from ctxext.errors import CtxextError, InputError
from ctxext.models.sources import resolve_model_path
from ctxext.models.weights import check_fingerprint, check_weights_readable, fingerprint
from ctxext.recipe.refusals import check_refusals
from ctxext.recipe.schema import Recipe, dump_recipe
from ctxext.training.checkpoints import Checkpoints, Counters
from ctxext.training.data.rows import shifted_labels
from ctxext.training.folder import (
    CHECKPOINTS,
    RunWriter,
    check_output_dir,
    flat_config,
    run_folder_lock,
    run_record,
    versions,
)
from ctxext.training.launch import Launch, configure_deepspeed, start_accelerator
from ctxext.training.loop import TrainingDiverged, TrainingLoop, TrainingState
from ctxext.training.probe import Probe
from ctxext.training.probe_inputs import ProbeInputs, probe_inputs_for
from ctxext.training.sequence_parallel import start_sequence_parallel, stop_sequence_parallel
from ctxext.training.steps import CausalLMWithChunkedLoss, make_optimizer, make_scheduler, micro_batches
from ctxext.training.stop import StopRequest, stop_on_signals

__all__ = [
    "CausalLMWithChunkedLoss",
    "TrainResult",
    "TrainingDiverged",
    "micro_batches",
    "read_run",
    "shifted_labels",
    "train",
]


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        run_dir: the complete run folder.
        model: the trained peft model (unwrapped, eval mode) on the main process, else ``None``.
        run: the run's record (``run.json``).
    """

    run_dir: Path
    model: Any
    run: RunRecord


def train(
    recipe: Recipe, resume: bool = False, command: list[str] | None = None, search: dict[str, Any] | None = None
) -> TrainResult:
    """Run a training recipe to completion and return its run folder.

    Args:
        recipe: a validated recipe.
        resume: continue the run in ``output.dir`` from its last checkpoint.
        command: the command line, recorded in ``versions.json``.
        search: the factor search the recipe's factors come from (``ctxext.search.recipe``), recorded in
            ``run.json``; its folder may already be inside ``output.dir`` when a new run starts.

    Returns:
        A :class:`TrainResult` (the complete run folder, the trained model).

    Raises:
        InputError: an output folder in the way or being written by another process, bad data, a recipe that
            differs from the run's on resume, a disk that filled up (the run is kept for ``--resume``).
        TrainingDiverged: NaN / inf loss; the last good checkpoint is kept for ``--resume``.
        CtxextError: out of memory, a bad multi-process launch, or SIGTERM / Ctrl-C (exit code 143 / 130; the
            run stops at a step boundary with a checkpoint, see :mod:`ctxext.training.stop`).
    """
    out = Path(recipe.output.dir)
    check_refusals(recipe)  # what `ctxext validate` refuses too: nothing is loaded for a recipe refused here
    launch = start_accelerator(recipe, out)
    # One writer per run folder: a second `train` (or a `--resume` of a run in progress) is refused here.
    with run_folder_lock(out, launch), stop_on_signals() as stop:
        result = _train(recipe, resume, command, launch, stop, search)
    # What the CLI chains after training (evaluation) runs in the main process alone: no split attention there.
    stop_sequence_parallel(result.model)
    if stop.signum is not None:
        # The signal came while the finished run wrote its outputs: it is complete, but what the CLI chains
        # after training (evaluation, push) must not start.
        raise CtxextError(
            f"{signal.Signals(stop.signum).name} received while the run finished; {out} is complete, and "
            "nothing after training was started",
            exit_code=128 + stop.signum,
        )
    return result


def _train(
    recipe: Recipe,
    resume: bool,
    command: list[str] | None,
    launch: Launch,
    stop: StopRequest,
    search: dict[str, Any] | None,
) -> TrainResult:
    """:func:`train` with the run folder's lock held and SIGTERM / SIGINT turned into a clean stop."""
    from accelerate.utils import DistributedType, set_seed

    from ctxext.training.model import build_training_model

    cfg = recipe.train
    out = Path(recipe.output.dir)
    accelerator = launch.accelerator

    # Nothing is loaded before the output folder and the base weights are known to be right.
    recipe_text = dump_recipe(recipe)
    previous = check_output_dir(out, recipe_text, resume, search_folder=Path(search["folder"]) if search else None)
    base_fingerprint = _check_base(recipe, previous)
    launch.check_resume(previous)
    _check_probe_launch(recipe, launch)

    set_seed(cfg.seed)
    loaded = build_training_model(
        recipe, accelerator.device, sharded=accelerator.distributed_type == DistributedType.FSDP
    )
    # The split is installed before the data and the run folder: a model it cannot split is refused first.
    launch.split = start_sequence_parallel(
        cfg.sequence_parallel_size,
        loaded.model,
        loaded.attn_implementation,
        cfg.micro_batch_size,
        cfg.context_parallel_size,
    )
    data = _training_data(recipe, loaded, launch)
    # The probe's key sets: a probe too short for its keys is refused before the run folder exists.
    probe_inputs = probe_inputs_for(recipe, loaded, data.validation_documents, accelerator) if cfg.probe else None

    # The run folder: created only once the model and the data are known to be usable.
    accelerator.wait_for_everyone()
    record = run_record(recipe, loaded, accelerator.num_processes, base_fingerprint, previous)
    record.folder = out.resolve()
    record.topology = TopologyRecord.model_validate(launch.topology())
    if search is not None:
        record.search = search
    writer = RunWriter(out, launch.main, record)
    writer.start(recipe_text, versions(recipe, command or sys.argv), data.mixture)
    stop.graceful = True  # from here a stop signal ends the run at a step boundary, with a checkpoint

    state = _prepare(recipe, launch, loaded, data, writer, stop, resume, probe_inputs)
    loop = TrainingLoop(state)
    loop.run()

    if state.probe is not None:
        state.probe.state.tick()
        if state.probe.restore_best(state.model, state.counters.step):
            state.last_val = None  # the held-out loss of the adapter written: the best probe's
    if state.last_val is None:
        state.last_val = loop.validate()
    return _finish(state, loop)


def _prepare(
    recipe: Recipe,
    launch: Launch,
    loaded: Any,
    data: Any,
    writer: RunWriter,
    stop: StopRequest,
    resume: bool,
    probe_inputs: ProbeInputs | None = None,
) -> TrainingState:
    """The loop's state: model (with its chunked loss), optimizer and schedule prepared, checkpoints, trackers, probe.

    The adaptive stop's probe runs on ``probe_inputs`` (none: no probe). On resume the last checkpoint is loaded
    into it (weights, optimizer, schedule, RNG, counters, the probe's state).
    """
    cfg, accelerator, out = recipe.train, launch.accelerator, writer.out
    model = CausalLMWithChunkedLoss(loaded.model, cfg.loss_chunk_size)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer, optimizer_name = make_optimizer(recipe, trainable, accelerator.device)
    scheduler = make_scheduler(recipe, optimizer)
    configure_deepspeed(accelerator, recipe, launch.world)
    model, optimizer = accelerator.prepare(model, optimizer)
    # FSDP2 replaces the parameters with sharded ones: clipping must see those (DDP keeps the same objects).
    trainable = [p for p in model.parameters() if p.requires_grad]
    counters = Counters()
    checkpoints = Checkpoints(out / CHECKPOINTS, accelerator, cfg.keep_checkpoints)
    checkpoints.register(model, scheduler, counters)
    if cfg.tracker != "none":
        accelerator.init_trackers(out.name or "ctxext", config=flat_config(recipe))
    probe = _probe(recipe, launch, probe_inputs) if probe_inputs is not None else None
    if resume:
        checkpoints.resume(counters)
    writer.trim_metrics(counters.step)
    return TrainingState(
        recipe=recipe,
        launch=launch,
        loaded=loaded,
        data=data,
        model=model,
        trainable=trainable,
        optimizer=optimizer,
        optimizer_name=optimizer_name,
        scheduler=scheduler,
        checkpoints=checkpoints,
        writer=writer,
        stop=stop,
        counters=counters,
        probe=probe,
    )


def _check_probe_launch(recipe: Recipe, launch: Launch) -> None:
    """Refuse the adaptive stop under a launch it does not run in, before anything is loaded or written."""
    from accelerate.utils import DistributedType

    if recipe.train.probe is not None and launch.accelerator.distributed_type == DistributedType.DEEPSPEED:
        # ZeRO partitions every weight: the probe's copy of the best weights would need DeepSpeed's gather.
        raise InputError(
            "train.probe: the adaptive stop does not run under a DeepSpeed engine (ZeRO) yet; launch with DDP or "
            "FSDP2 (configs/accelerate/), or set train.probe: null"
        )


def _probe(recipe: Recipe, launch: Launch, inputs: ProbeInputs) -> Probe:
    """The adaptive stop (``train.probe``) on its key sets, its state registered with the checkpoints."""
    probe = Probe(recipe, inputs, launch)
    launch.accelerator.register_for_checkpointing(probe.state)
    forms = inputs.forms_line()
    if forms:
        launch.accelerator.print(forms)
    grid = inputs.grid
    where = f" at {len(grid)} depths from 0 to 100 %" if grid else ""
    goal = f"{probe.settings.goal:.0%}{probe.every}"
    patience = f"patience {probe.settings.patience}" if probe.settings.patience else "no stop on a plateau"
    launch.accelerator.print(
        f"probe: {inputs.trials} keys at {inputs.length} tokens{where} every {probe.settings.interval} steps on "
        f"{inputs.filler:,} tokens of held-out validation documents (goal {goal}, {patience}, at most "
        f"{recipe.train.max_steps} steps)"
    )
    return probe


def _finish(state: TrainingState, loop: TrainingLoop) -> TrainResult:
    """Write the adapter, the patched config and the tokenizer, then mark the run complete (main process)."""
    accelerator, out = state.launch.accelerator, state.writer.out
    state_dict = accelerator.get_state_dict(state.model)
    accelerator.wait_for_everyone()
    if state.launch.main:
        state.writer.write_outputs(accelerator.unwrap_model(state.model).peft_model, state_dict, state.loaded)
        _mark_complete(state)
    accelerator.wait_for_everyone()
    if state.recipe.train.tracker != "none":
        accelerator.end_training()
    val = "none" if state.last_val is None else f"{state.last_val:.4f}"
    probe = state.probe
    if probe is not None:
        accelerator.print(probe.summary_line(state.counters.step))
    cost = (
        ""
        if probe is None
        else (
            f"; stop: {probe.outcome(state.counters.step)} at step {state.counters.step}, adapter of step "
            f"{probe.state.best_step}, probe {(probe.state.fraction or 0):.1%} of the run time"
        )
    )
    accelerator.print(f"run complete: {out} (train loss {state.last_loss:.4f}, val loss {val}{cost})")
    unwrapped = accelerator.unwrap_model(state.model).peft_model.eval() if state.launch.main else None
    return TrainResult(run_dir=out, model=unwrapped, run=state.writer.run.model_copy())


def _check_base(recipe: Recipe, previous: RunRecord | None) -> str:
    """The base weights' fingerprint, once they are readable (and, on resume, the same as the run's)."""
    base_dir = resolve_model_path(recipe.model.path, recipe.model.revision)
    check_weights_readable(base_dir)
    base_fingerprint = fingerprint(base_dir)
    if previous is not None:
        check_fingerprint(base_dir, previous.base_fingerprint, "--resume")
    return base_fingerprint


def _mark_complete(state: TrainingState) -> None:
    """Record in run.json that the run completed, with its final counters and losses (and the probe's curve)."""
    probe, step = state.probe, state.counters.step
    if probe is not None:
        probe.write_curve(state.writer.out, step)
        note = probe.write_plot(state.writer.out)
        if note:
            print(note)
        state.writer.update(probe=ProbeRecord.model_validate(probe.record(step)))
    state.writer.update(
        status="complete",
        steps=state.counters.step,
        tokens_seen=state.counters.tokens_seen,
        final_train_loss=state.last_loss,
        final_val_loss=state.last_val,
        error=None,
    )


def _training_data(recipe: Recipe, loaded: Any, launch: Launch) -> Any:
    """Tokenize, pack and hold out the recipe's data for this job.

    See :func:`ctxext.training.data.mixture.prepare_training_data`.

    Raises:
        InputError: too little data for one micro-batch on every process.
    """
    from ctxext.training.data.mixture import prepare_training_data

    cfg, accelerator = recipe.train, launch.accelerator
    with accelerator.main_process_first():  # the main process tokenizes; the others read the datasets cache
        rows = cfg.max_steps * cfg.gradient_accumulation_steps * cfg.micro_batch_size * launch.world
        data = prepare_training_data(recipe, loaded.tokenizer, loaded.plan, rows)
    accelerator.print(f"data: {data.summary}")
    # Too little data for one micro-batch is bad input: say so before the run folder exists.
    next(micro_batches(len(data.train), cfg.micro_batch_size, launch.world, launch.rank, cfg.seed))
    return data
