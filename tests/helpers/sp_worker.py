"""One training micro-batch per case through ctxext's own pieces, under whatever launcher started this process.

``python tests/helpers/sp_worker.py OUT CASES RECIPE[:N[:C]] ...``: for each recipe (with
``train.sequence_parallel_size=N`` and ``train.context_parallel_size=C`` when given) builds the recipe's model
(:func:`build_training_model`), starts the split (:func:`start_sequence_parallel`), wraps and prepares the model as
``ctxext train`` does, feeds one fixed micro-batch per case (``CASES``, comma-separated: ``plain``, ``pose``,
``masked``: packed documents of random lengths, one crossing the shard boundary, kept apart by
``data.document_mask``'s block-causal mask, or ``ignored``: the second half of every row unlabelled, so with two
processes one shard has no labelled token), backpropagates, and writes the loss as the training loop logs it and
every trainable gradient to ``OUT`` (main process), per ``Path(spec).name``. Launched with one process it is the
reference; launched with ``accelerate launch --num_processes 2`` (or 4) and ``:2`` (or ``:4``) it is the split.
Several recipes share one launch: each start of the split replaces the last.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ctxext.models.sources import resolve_model_path
from ctxext.recipe.schema import load_recipe
from ctxext.training.data.rows import IGNORE_INDEX, build_inputs
from ctxext.training.launch import start_accelerator
from ctxext.training.losses import micro_batch_loss
from ctxext.training.sequence_parallel import start_sequence_parallel
from ctxext.training.steps import CausalLMWithChunkedLoss


def run_recipe(spec: str, out: str, cases: str, launch: object = None) -> tuple[dict, object]:
    """The cases of one ``RECIPE[:N[:C]]`` (the accelerator of the first recipe serves the others)."""
    from ctxext.training.model import build_training_model

    path, size, ring = (*spec.split(":"), "", "")[:3]
    overrides = [f"train.sequence_parallel_size={size}"] if size else []
    recipe = load_recipe(path, overrides + ([f"train.context_parallel_size={ring}"] if ring else []))
    cfg = recipe.train
    launch = launch or start_accelerator(recipe, Path(out).parent)
    acc = launch.accelerator
    # As `ctxext train` does: the model folder exists (a built-in is built, drawing random numbers) before seeding.
    with acc.main_process_first():
        resolve_model_path(recipe.model.path)
    torch.manual_seed(cfg.seed)
    loaded = build_training_model(recipe, acc.device)
    released = sys.modules.get("deepspeed.runtime.sequence_parallel.parallel_state_sp")
    if released is not None:  # DeepSpeed keeps one set of groups per process: the previous recipe's go
        released._release_sequence_parallel_groups()
    split = start_sequence_parallel(
        cfg.sequence_parallel_size,
        loaded.model,
        loaded.attn_implementation,
        cfg.micro_batch_size,
        cfg.context_parallel_size,
    )
    gen = torch.Generator().manual_seed(1234)
    # LoRA starts with B = 0, which leaves every A gradient 0: give B values so that all gradients are tested.
    with torch.no_grad():
        for name, param in loaded.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    model = acc.prepare(CausalLMWithChunkedLoss(loaded.model, cfg.loss_chunk_size))
    results = {"engine": split.engine}
    for case in cases.split(","):
        ids = torch.randint(0, loaded.model.config.vocab_size, (cfg.micro_batch_size, recipe.seq_len), generator=gen)
        rows = {"input_ids": ids}
        if case == "masked":
            # Document starts at random places in each row (a row of one document included), as packing makes.
            starts = torch.zeros_like(ids)
            for row in range(1, ids.shape[0]):
                starts[row, torch.randint(1, recipe.seq_len, (5,), generator=gen)] = 1
            rows["segments"] = starts.cumsum(dim=1)
        inputs = build_inputs(
            rows,
            attn_implementation=loaded.attn_implementation,
            target_length=loaded.plan.target_length if loaded.plan else None,
            pose_chunks=2 if case == "pose" else None,
            seed=cfg.seed,
        )
        # A quarter of the labels ignored at random, as answer-only task rows and segment ends do.
        inputs.labels[torch.rand(inputs.labels.shape, generator=gen) < 0.25] = IGNORE_INDEX
        if case == "ignored":
            inputs.labels[:, recipe.seq_len // 2 :] = IGNORE_INDEX
        model.zero_grad(set_to_none=True)
        with split.place(inputs.to(acc.device)) as inputs:
            total, count = model(inputs.input_ids, inputs.labels, inputs.position_ids, inputs.attention_mask)
            loss = micro_batch_loss(total, inputs.labels, 1)  # the training loop's rule, on this shard
            acc.backward(loss)
        params = acc.unwrap_model(model).named_parameters()
        results[case] = {
            "loss": acc.reduce(loss.detach(), "mean").item(),
            "grads": {n: p.grad.detach().clone() for n, p in params if p.requires_grad},
        }
    return results, launch


def main(out: str, cases: str, *specs: str) -> None:
    launch, results = None, {}
    for spec in specs:
        results[Path(spec).name], launch = run_recipe(spec, out, cases, launch)
    acc = launch.accelerator  # type: ignore[attr-defined]
    if acc.is_main_process:
        torch.save({"processes": acc.num_processes, "recipes": results}, out)
    acc.wait_for_everyone()


if __name__ == "__main__":
    main(*sys.argv[1:])
