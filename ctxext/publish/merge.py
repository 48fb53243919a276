"""Folding a run's LoRA weights and fully trained modules into the full-precision base: ``ctxext merge``.

Training keeps the base weights in 4 bits; a published model must not. The merge therefore loads the
base model again in full precision with the run's patched config (so its rotary modules are built
with the extended RoPE, then verified), applies the adapter (LoRA + ``modules_to_save`` such as the
embeddings and norms), and folds it in with peft's ``merge_and_unload``.

Nothing is trusted until checked. The merged folder is written to a temporary sibling, reloaded with
plain transformers, its RoPE and tied embeddings verified again, and compared with the un-merged base +
adapter: logits at positions spread over one random sequence at the target length and more at the original
window must agree within a stated tolerance; a perplexity check and one passkey trial are printed
(:mod:`ctxext.publish.smoke`, which says up front how long it will take). Only then is the folder renamed into
place; on failure it is deleted and the command exits non-zero.

A run calibrated by ``ctxext calibrate`` runs base + adapter with its attention temperature, and the merged
model carries it in its query projections (:func:`ctxext.models.temperature.fold_attention_temperature`),
so the same logit comparison checks the fold.

A full fine-tune (``train.mode: full``) has no adapter: its run folder is already the whole model. Merging it
writes that model as a published folder the same way — its calibrated temperature folded in, reloaded, checked
against the run folder as it loads, with the record ``ctxext push`` and the card read — so every run, whatever
its mode, ends in the same kind of folder.
"""

from __future__ import annotations

import gc
import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ctxext.artifacts.lock import folder_lock
from ctxext.artifacts.run import MergedRecord, RunRecord, find_reports, plan_from_run, read_run
from ctxext.atomic import atomic_folder, check_inputs_outside, check_output
from ctxext.errors import CtxextError, InputError
from ctxext.models.cost import ForwardClock
from ctxext.models.temperature import (
    fold_attention_temperature,
    query_projection,
    run_temperature,
    set_attention_temperature,
)
from ctxext.models.weights import check_adapter_readable, check_fingerprint, check_weights_readable
from ctxext.progress import progress
from ctxext.publish.smoke import Probe, SmokeChecks, SmokeResult, check_written

MERGED_KIND = "merged-model"

# Default max |Δlogit| between the reloaded merged model and base + adapter. float32 merging only
# reorders additions (W x + B A x vs (W + B A) x): ~1e-6 relative. 16-bit weights round W + BA.
DEFAULT_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.5, torch.float16: 0.1}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_COPY_FILES = ("recipe.yaml", "versions.json")
_TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_Log = Callable[[str], None]


class MergeCheckError(CtxextError):
    """The merged model does not reproduce base + adapter; nothing was written."""

    exit_code = 1


def _check_settings(
    tolerance: float | None, smoke_length: int | None, sequences: int, positions: int, check_length: int | None
) -> None:
    """Refuse settings that would make the smoke test check nothing (before the run is read)."""
    if sequences < 1:
        raise InputError(f"--sequences {sequences}: must be at least 1 (random sequences whose logits are compared)")
    if positions < 1:
        raise InputError(f"positions {positions}: must be at least 1 (logit positions compared per sequence)")
    if smoke_length is not None and smoke_length < 2:
        raise InputError(f"--smoke-length {smoke_length}: must be at least 2 tokens")
    if check_length is not None and check_length < 16:
        raise InputError(f"--check-length {check_length}: must be at least 16 tokens (a passkey prompt and its key)")
    if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0):
        raise InputError(f"--tolerance {tolerance}: must be a finite number >= 0")


def _device(device: str) -> torch.device:
    from ctxext.models.devices import resolve_device

    return resolve_device(device)


def _dtype(dtype: str, device: torch.device, config: Any) -> torch.dtype:
    if dtype != "auto":
        if dtype not in _DTYPES:
            raise InputError(f"--dtype {dtype!r}: choose auto, {', '.join(_DTYPES)}")
        return _DTYPES[dtype]
    if device.type == "cpu":
        # bf16 matmuls are ~25x slower than fp32 on these CPUs, and fp32 makes the check tightest.
        return torch.float32
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    stored = _DTYPES.get(str(stored).replace("torch.", ""), torch.float32) if stored else torch.float32
    return stored


def _base_folder(run: RunRecord) -> Path:
    from ctxext.models.sources import resolve_model_path

    resolved = run.base_model_resolved
    if resolved and (Path(resolved) / "config.json").is_file():
        return Path(resolved)
    return resolve_model_path(run.base_model, run.base_model_revision)


def _patched_config(base_dir: Path, run_dir: Path, run: RunRecord) -> tuple[Any, int | None]:
    # The base's own config with the run's RoPE fields: the run's config.json may carry training-only
    # fields (quantization_config) that must not reach a full-precision model.
    from ctxext.models.sources import config_from_folder

    config = config_from_folder(base_dir)
    if getattr(config, "quantization_config", None):
        raise InputError(
            f"the base model {base_dir} is stored quantized ({config.quantization_config.get('quant_method', '?')}); "
            "merging needs the full-precision base weights. Point run.json's base_model at the original checkpoint."
        )
    run_cfg_path = run_dir / "config.json"
    run_cfg = json.loads(run_cfg_path.read_text()) if run_cfg_path.is_file() else {}
    params = run_cfg.get("rope_parameters") or run.rope_parameters
    if not isinstance(params, dict) or "rope_type" not in params:
        raise InputError(
            f"{run_dir} records no rope_parameters (neither config.json nor run.json): cannot rebuild the extended RoPE"
        )
    config.rope_parameters = dict(params)
    config.max_position_embeddings = int(
        run_cfg.get("max_position_embeddings") or run.target_length or config.max_position_embeddings
    )
    if run_cfg.get("original_max_position_embeddings") is not None:
        config.original_max_position_embeddings = run_cfg["original_max_position_embeddings"]
    meta = run_cfg.get("ctxext") or {
        "method": run.method,
        "original_length": run.original_length,
        "target_length": run.target_length,
        "factor": run.factor,
    }
    config.ctxext = meta
    # Training may have resized the embeddings (added tokens); the adapter's copy has the new size.
    vocab = run_cfg.get("vocab_size")
    resized = int(vocab) if vocab and int(vocab) != int(config.vocab_size) else None
    return config, resized


def _tokenizer(run_dir: Path, base_dir: Path) -> Any:
    from transformers import AutoTokenizer

    source = run_dir if any((run_dir / m).is_file() for m in _TOKENIZER_MARKERS) else base_dir
    return AutoTokenizer.from_pretrained(source)


def _copy_reports(run_dir: Path, out: Path) -> None:
    src = run_dir / "eval"
    if not src.is_dir():
        return
    for path in src.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".md", ".png"):
            dst = out / "eval" / path.relative_to(src)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dst)


def merge_run(
    run_dir: str | Path,
    out: str | Path,
    tolerance: float | None = None,
    smoke_length: int | None = None,
    sequences: int = 2,
    positions: int = 256,
    device: str = "auto",
    dtype: str = "auto",
    allow_incomplete: bool = False,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
    check_length: int | None = None,
    force_flag: str | None = "--force",
) -> SmokeResult:
    """Merge a run into a standalone model folder that plain transformers loads, after checking it.

    Args:
        run_dir: the run folder written by ``ctxext train``.
        out: the merged model folder to write (must not exist unless ``overwrite``).
        tolerance: max |Δlogit| allowed between the merged model and base + adapter (default by dtype:
            1e-3 for float32, 0.1 for float16, 0.5 for bfloat16).
        smoke_length: tokens of the one full-length logits check (default: the run's target length).
        sequences: random sequences whose logits are compared (the first at ``smoke_length``).
        positions: logit positions compared per sequence.
        device: ``auto`` (CUDA if available), ``cpu``, ``cuda``, ``cuda:1`` …
        dtype: ``auto`` (float32 on CPU, the base's stored dtype on GPU), ``float32``, ``bfloat16``, ``float16``.
        allow_incomplete: merge an unfinished run.
        overwrite: replace an existing ``out``.
        log: where progress lines go.
        check_length: tokens of the other checks: the other sequences, the perplexity and the passkey trial
            (default: the run's original window, at most ``smoke_length``).
        force_flag: the calling command's flag for ``allow_incomplete``, named when an unfinished run is refused
            (``None``: it has none).

    Returns:
        The :class:`SmokeResult` (also saved in ``<out>/ctxext_merge.json``).

    Raises:
        InputError: ``out`` exists (without ``overwrite``, or is not an earlier merge output), is or contains
            the run or the base, or the base's weights are damaged or not the ones the run was trained on.
        MergeCheckError: the smoke test failed; nothing is left at ``out``.
    """
    started = time.time()
    _check_settings(tolerance, smoke_length, sequences, positions, check_length)
    dev = _device(device)  # a device that does not exist is refused before the run is read
    run_dir, out = Path(run_dir), Path(out)
    run = read_run(run_dir, allow_incomplete=allow_incomplete, force_flag=force_flag)
    full = run.mode == "full"
    if not full and not (run_dir / "adapter_config.json").is_file():
        raise InputError(f"run {run_dir} has no adapter_config.json: there is no adapter to merge")
    check_inputs_outside(out, [run_dir])
    check_output(out, MERGED_KIND, overwrite)
    with folder_lock(out):  # one writer per folder, from the first check to the last write
        # The run's reports travel with the merged model for its card: one that does not read fails now, not at push.
        find_reports(run_dir)
        temperature = run_temperature(run_dir)
        if full:
            # A full fine-tune's run folder is the model: the merge writes it as a published model (with a
            # calibrated temperature folded into its weights) and checks the copy like any other merge.
            model, config, torch_dtype, tokenizer = _full_run(run_dir, dev, dtype, temperature, log)
        else:
            base_dir = _base_folder(run)
            check_inputs_outside(out, [base_dir])
            check_weights_readable(base_dir)
            check_adapter_readable(run_dir)
            check_fingerprint(base_dir, run.base_fingerprint, "merge")
            config, resized = _patched_config(base_dir, run_dir, run)
            torch_dtype = _dtype(dtype, dev, config)
            if temperature != 1.0:
                query_projection(str(config.model_type))  # a type the fold does not know is refused before any load
            model = _base_with_adapter(base_dir, run_dir, config, resized, dev, torch_dtype, log)
            if temperature != 1.0:
                set_attention_temperature(model, temperature)
            tokenizer = _tokenizer(run_dir, base_dir)
        tol = float(tolerance if tolerance is not None else DEFAULT_TOLERANCE[torch_dtype])
        checks = _checks(run, config, smoke_length, check_length, sequences, positions)
        checks.announce(ForwardClock.measure(model, min(256, checks.check_length)), log)
        with progress("merge check", len(checks.forwards()), unit="forward", every=1) as tick:
            probe = Probe.measure(model, tokenizer, checks, dev, log, tick)
            merged, embeddings = _merged(model, temperature, log)
            del model
            with atomic_folder(out, kind=MERGED_KIND, overwrite=overwrite) as tmp:
                _save(merged, tokenizer, run_dir, tmp)
                del merged
                gc.collect()
                expect_tied = embeddings == "tied"
                args = (tmp, probe, plan_from_run(run, config), tokenizer, tol, torch_dtype, dev, expect_tied, log)
                result = check_written(*args, tick)
                result.seconds = round(time.time() - started, 2)
                result.attention_temperature = temperature
                result.embeddings = embeddings if embeddings == "untied" else result.embeddings
                _refuse_failed(result, out)
                MergedRecord(run=run, smoke=result.to_dict(), source_run=str(run_dir.resolve())).write(tmp)
        log(f"merged model written to {out} ({result.seconds:.1f} s)")
        return result


def _full_run(
    run_dir: Path, dev: torch.device, dtype: str, temperature: float, log: _Log
) -> tuple[Any, Any, torch.dtype, Any]:
    """A full fine-tune's model, config, dtype and tokenizer (``temperature``: the run's, which the loader applies)."""
    from ctxext.models.load import ModelSpec, load_model
    from ctxext.models.sources import config_from_folder

    check_weights_readable(run_dir)
    config = config_from_folder(run_dir)
    if temperature != 1.0:
        query_projection(str(config.model_type))  # a type the fold does not know is refused before any load
    torch_dtype = _dtype(dtype, dev, config)
    log(f"loading the full fine-tune {run_dir} in {str(torch_dtype).replace('torch.', '')} on {dev}")
    loaded = load_model(ModelSpec(str(run_dir)), device=dev, dtype=torch_dtype, what="merge")
    log(f"  RoPE: {loaded.rope_check.summary() if loaded.rope_check else 'not verified'}")
    return loaded.model, config, torch_dtype, loaded.tokenizer


def _checks(
    run: RunRecord, config: Any, smoke_length: int | None, check_length: int | None, sequences: int, positions: int
) -> SmokeChecks:
    """The merge check's lengths: the full one once (the target), the rest at the original window."""
    # A run without a RoPE change (method none) has no target length: check at the configured context.
    length = int(smoke_length or run.target_length or config.max_position_embeddings)
    short = int(check_length or min(int(run.original_length or length), length))
    return SmokeChecks(length=length, check_length=min(short, length), sequences=sequences, positions=positions)


def _merged(model: Any, temperature: float, log: _Log) -> tuple[Any, str]:
    """Fold the adapter (and a calibrated temperature) into the weights; say what became of tied embeddings."""
    from ctxext.models.embeddings import embeddings_tied, ties_declared, untie_if_diverged
    from ctxext.models.load import base_model

    plain = not hasattr(model, "merge_and_unload")  # a full fine-tune: the model is already whole
    declared = ties_declared(base_model(model).config)
    merged = model if plain else model.merge_and_unload()
    if untie_if_diverged(merged, declared):
        embeddings = "untied"
        log(
            "  untied lm_head from the trained input embeddings (tie_word_embeddings=false): this adapter trained "
            "them as a separate copy; the model card says so"
        )
    else:
        embeddings = "tied" if embeddings_tied(merged) else "separate"
    if temperature != 1.0:
        # The calibrated temperature goes into the weights, so any stack loads it with no setting.
        set_attention_temperature(merged, 1.0)
        fold_attention_temperature(merged, temperature)
        log(f"  attention temperature {temperature:g} (calibration.json) folded into the query projections")
    return merged, embeddings


def _save(merged: Any, tokenizer: Any, run_dir: Path, tmp: Path) -> None:
    merged.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    for name in _COPY_FILES:
        if (run_dir / name).is_file():
            shutil.copy2(run_dir / name, tmp / name)
    _copy_reports(run_dir, tmp)


def _refuse_failed(result: SmokeResult, out: Path) -> None:
    if result.ok:
        return
    untied = " or tied embeddings came back as two tensors" if result.embeddings == "separate" else ""
    raise MergeCheckError(
        "merge check failed: the merged model differs from base + adapter by up to "
        f"{result.max_abs_diff:.3g} in the logits (tolerance {result.tolerance:g}), its perplexity is not finite "
        f"({result.ppl:.4g}){untied}. Nothing was written to {out}. A custom-code model may need attention; a "
        "16-bit dtype may need a larger --tolerance."
    )


def _base_with_adapter(
    base_dir: Path, run_dir: Path, config: Any, resized: int | None, dev: torch.device, dtype: torch.dtype, log: _Log
) -> Any:
    """The full-precision base with the run's RoPE (verified) and the run's adapter on top, in eval mode."""
    from peft import PeftModel

    from ctxext.models.build import load_weights
    from ctxext.rope.runtime import verify_model_rope

    log(f"loading the base {base_dir} in {str(dtype).replace('torch.', '')} on {dev} with the run's RoPE")
    model = load_weights(base_dir, config, compute_dtype=dtype, device=dev)
    if resized:
        model.resize_token_embeddings(int(resized))
    model.eval()
    check = verify_model_rope(model)
    log(f"  base RoPE: {check.summary()}")
    return PeftModel.from_pretrained(model, run_dir, is_trainable=False).eval()
