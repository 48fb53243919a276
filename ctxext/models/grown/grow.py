"""Grow a model: split, tokenizer, one or two pretraining stages (or one more on a saved model), save."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ctxext.atomic import check_output
from ctxext.errors import InputError
from ctxext.models.grown.data import Split, encode_files, split_files, train_tokenizer
from ctxext.models.grown.settings import GrowSettings
from ctxext.models.grown.train import GROWN_KIND, Log, as_loaded, load_saved, pretrain, save_model

REPORT_JSON = "grow_report.json"
HELDOUT_LIST = "heldout_files.txt"
# The settings class a caller grows with (a subclass may add its own knobs, e.g. measurement ones).
S = TypeVar("S", bound=GrowSettings)


def _second_stage(s: S) -> S:
    # More needles at a lower lr, a fresh AdamW; held-out losses at least twice in the stage.
    return dataclasses.replace(
        s,
        seed=s.stage2_seed,
        steps=s.stage2_steps,
        needle_share=s.stage2_needle_share,
        lr=s.stage2_lr,
        warmup=s.stage2_warmup,
        eval_every=min(s.eval_every, s.stage2_steps // 2 or 1),
    )


def _earlier_stages(init_from: Path) -> list[dict[str, Any]]:
    # A continued model's report lists the stages that made the model it continues.
    report_file = init_from / REPORT_JSON
    if not report_file.is_file():
        return []
    old = json.loads(report_file.read_text())
    own = {k: old[k] for k in ("train_command", "settings", "training") if k in old}
    return [*old.get("earlier_stages", []), own]


def grow(
    s: S,
    out: Path,
    log: Log,
    init_from: Path | None = None,
    report_files: Callable[[S, dict[str, Any]], dict[str, str]] | None = None,
    split: Split | None = None,
) -> tuple[S, dict[str, Any]]:
    """Pretrain a grown model and save it (model, tokenizer, held-out file list) to ``out``.

    A new model trains stage 1 with ``s`` and, when ``s.stage2_steps > 0``, stage 2; a model continued
    from ``init_from`` (same tokenizer) trains one stage with ``s``.

    Args:
        s: the recipe.
        out: the folder to write (replaced only when this builder wrote it).
        log: receives progress lines.
        init_from: a saved grown model to continue.
        report_files: given the last stage's settings and the report, the files (name → text) to save with
            the model, in the same atomic write (e.g. the report itself).
        split: (stdlib root, training files, held-out files) to use instead of
            :func:`~ctxext.models.grown.data.split_files` of ``s.heldout_mod`` (e.g. a few files for a quick check).

    Returns:
        The last stage's settings and the report: ``training`` (the last stage), ``earlier_stages``, ``split``.

    Raises:
        InputError: ``init_from`` holds no saved model, or ``out`` holds something this builder did not write.
    """
    if init_from is not None and not (init_from / "config.json").is_file():
        raise InputError(f"--init-from {init_from}: no saved model there (config.json missing); grow one first")
    # Before any work: the save at the end would refuse a folder this builder did not write.
    check_output(out, GROWN_KIND, overwrite=True)
    root, train_files, heldout_files = split if split is not None else split_files(s.heldout_mod)
    log(f"split: {len(train_files)} training files, {len(heldout_files)} held out")
    t0 = time.time()
    init = None
    if init_from is not None:
        # A further stage: continue training a saved model (same tokenizer) with these settings.
        init, tokenizer = load_saved(init_from)
        init.train()
        if init.config.max_position_embeddings != s.window:
            # A window stage (as real pretraining lengthens its window late): the saved model becomes a model
            # of --window; RoPE's base stays, the stage trains the new positions.
            log(f"window: {init.config.max_position_embeddings} -> {s.window} tokens (max_position_embeddings)")
            init.config.max_position_embeddings = s.window
    else:
        tokenizer = as_loaded(s, train_tokenizer(train_files, s.vocab_size))
    train_docs = encode_files(tokenizer, train_files)
    heldout_docs = encode_files(tokenizer, heldout_files)
    log(f"tokenizer: {len(tokenizer)} tokens in {time.time() - t0:.0f} s")
    model, training = pretrain(s, tokenizer, train_docs, heldout_docs, log, model=init)
    earlier: list[dict[str, Any]] = []
    if init is None and s.stage2_steps > 0:
        log("stage 2: more needles, lower lr")
        earlier = [{"settings": dataclasses.asdict(s), "training": training}]
        s = _second_stage(s)
        model, training = pretrain(s, tokenizer, train_docs, heldout_docs, log, model=model)
    if init_from is not None:
        earlier = _earlier_stages(init_from)
    report: dict[str, Any] = {"earlier_stages": earlier} if earlier else {}
    report["training"] = training
    report["split"] = {
        "rule": f"held out when int(sha1(path relative to stdlib root).hexdigest(), 16) % {s.heldout_mod} == 0",
        "stdlib_root": str(root),
        "train_files": len(train_files),
        "heldout_files": len(heldout_files),
    }
    files = {HELDOUT_LIST: "\n".join(p.relative_to(root).as_posix() for p in heldout_files) + "\n"}
    files.update(report_files(s, report) if report_files else {})
    save_model(model, tokenizer, out, files)
    log(f"saved to {out}")
    return s, report
