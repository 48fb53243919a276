"""Folding a run's LoRA weights and fully trained modules into the full-precision base: ``ctxext merge``.

Training keeps the base weights in 4 bits; a published model must not. The merge therefore loads the
base model again in full precision with the run's patched config (so its rotary modules are built
with the extended RoPE, then verified), applies the adapter (LoRA + ``modules_to_save`` such as the
embeddings and norms), and folds it in with peft's ``merge_and_unload``.

Nothing is trusted until checked. The merged folder is written to a temporary sibling, reloaded with
plain transformers, its RoPE verified again, and compared at the target length with the un-merged
base + adapter: logits at positions spread over a few random sequences must agree within a stated
tolerance. A short perplexity check and one passkey trial at the target length are printed. Only
then is the folder renamed into place; on failure it is deleted and the command exits non-zero.

A run calibrated by ``ctxext calibrate`` runs base + adapter with its attention temperature, and the merged
model carries it in its query projections (:func:`ctxext.models.temperature.fold_attention_temperature`),
so the same logit comparison checks the fold.
"""

from __future__ import annotations

import gc
import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ctxext.artifacts.lock import folder_lock
from ctxext.artifacts.run import MergedRecord, RunRecord, find_reports, plan_from_run, read_run
from ctxext.atomic import atomic_folder, check_inputs_outside, check_output
from ctxext.errors import CtxextError, InputError
from ctxext.models.temperature import (
    fold_attention_temperature,
    query_projection,
    run_temperature,
    set_attention_temperature,
)
from ctxext.models.weights import check_fingerprint, check_weights_readable
from ctxext.rope.verify import verify_folder

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


@dataclass
class SmokeResult:
    """What the merge smoke test measured.

    Attributes:
        length: tokens per test sequence (the target length unless shortened).
        sequences: random sequences whose logits were compared.
        positions: logit positions compared per sequence (spread from the first to the last token).
        max_abs_diff: largest |merged − (base + adapter)| logit difference.
        mean_abs_diff: mean of the same.
        argmax_agreement: fraction of compared positions where both predict the same next token.
        tolerance: the bound ``max_abs_diff`` had to stay within.
        dtype: the weights' dtype.
        device: where the check ran.
        ppl: perplexity of the reloaded merged model on ``ppl_tokens`` tokens of standard-library source.
        reference_ppl: the same for base + adapter.
        ppl_tokens: scored tokens.
        passkey_key: the key hidden in the passkey prompt.
        passkey_answer: the merged model's argmax continuation at the answer positions (teacher-forced).
        passkey_correct: whether every answer token is the argmax (greedy decoding produces the key).
        passkey_depth: where the key was hidden (fraction of the filler).
        rope: the runtime RoPE check of the reloaded model.
        ok: the logits agreed within tolerance and the perplexity is finite.
        seconds: time taken by the whole merge.
        attention_temperature: the calibrated factor folded into the query projections (1.0: none).
    """

    length: int
    sequences: int
    positions: int
    max_abs_diff: float
    mean_abs_diff: float
    argmax_agreement: float
    tolerance: float
    dtype: str
    device: str
    ppl: float
    reference_ppl: float
    ppl_tokens: int
    passkey_key: str
    passkey_answer: str
    passkey_correct: bool
    passkey_depth: float
    rope: str
    ok: bool
    seconds: float = 0.0
    attention_temperature: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)


def _check_settings(tolerance: float | None, smoke_length: int | None, sequences: int, positions: int) -> None:
    """Refuse settings that would make the smoke test check nothing (before the run is read)."""
    if sequences < 1:
        raise InputError(f"--sequences {sequences}: must be at least 1 (random sequences whose logits are compared)")
    if positions < 1:
        raise InputError(f"positions {positions}: must be at least 1 (logit positions compared per sequence)")
    if smoke_length is not None and smoke_length < 2:
        raise InputError(f"--smoke-length {smoke_length}: must be at least 2 tokens")
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


def _positions(length: int, count: int) -> torch.Tensor:
    # Spread over the whole sequence, first and last token included: the last positions attend to
    # everything, the first ones isolate the embeddings.
    return torch.unique(torch.linspace(0, length - 1, steps=min(count, length)).round().long())


@torch.no_grad()
def _logits_at(model: Any, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    from ctxext.rope.runtime import reset_dynamic_rope

    reset_dynamic_rope(model)
    out = model(input_ids=ids, logits_to_keep=positions.to(ids.device), use_cache=False)
    return out.logits.float().cpu()


@torch.no_grad()
def _nll(causal_lm: Any, ids: torch.Tensor) -> tuple[float, int]:
    # Mean next-token NLL through the evaluator's one scorer (chunked projection, logit softcapping).
    from ctxext.rope.runtime import reset_dynamic_rope
    from ctxext.scoring.nll import token_nll

    reset_dynamic_rope(causal_lm)
    nll = token_nll(causal_lm, ids)
    return float(nll.double().mean()), nll.numel()


def text_tokens(tokenizer: Any, length: int) -> torch.Tensor:
    """``length`` tokens of real text (the Python standard library's source, present on every machine).

    Args:
        tokenizer: the model's tokenizer.
        length: tokens wanted.

    Returns:
        A ``(1, length)`` tensor; the tokenizer's own BOS first if it adds one.
    """
    from ctxext.models.builtin import stdlib_files

    pieces: list[str] = []
    chars = 0
    # Long files in path order: deterministic, and long-range structure within a file.
    for path in stdlib_files(min_bytes=40_000):
        text = path.read_text(encoding="utf-8", errors="replace")
        pieces.append(text)
        chars += len(text)
        if chars > length * 8:
            break
    ids = tokenizer("\n".join(pieces)).input_ids[:length]
    if len(ids) < length:
        raise CtxextError(f"not enough standard-library text for a {length}-token perplexity check; use --smoke-length")
    return torch.tensor([ids], dtype=torch.long)


def passkey_prompt(tokenizer: Any, length: int, depth: float, seed: int = 0) -> Any:
    """The passkey task's sample (:mod:`ctxext.tasks`, template 0: the landmark-attention prompt).

    Args:
        tokenizer: the model's tokenizer.
        length: the total length, answer included.
        depth: where the key sits in the filler (0 = start, 1 = end).
        seed: chooses the key and the filler offset.

    Returns:
        A :class:`ctxext.tasks.TaskSample` (``ids`` = prompt + answer, ``answer_span``).
    """
    import random

    from ctxext.tasks import Haystack, get_task

    hay = Haystack.noise(tokenizer, length)
    return get_task("passkey").generate(tokenizer, hay, length, depth, random.Random(seed))


@torch.no_grad()
def passkey_trial(model: Any, tokenizer: Any, length: int, seed: int = 0, depth: float = 0.5) -> tuple[str, str, bool]:
    """One passkey retrieval at ``length`` tokens (prompt + answer), scored teacher-forced.

    Correct iff every answer token is the argmax at its position — exactly what greedy decoding would
    produce, with no KV cache and no ``generation_config`` (see
    :func:`ctxext.scoring.answers.score_answers`).

    Args:
        model: a causal LM.
        tokenizer: its tokenizer.
        length: total tokens (prompt + answer).
        seed: chooses the key.
        depth: where the key is hidden.

    Returns:
        ``(key, the model's argmax continuation at the answer positions, correct)``.
    """
    from ctxext.rope.runtime import reset_dynamic_rope
    from ctxext.scoring.answers import score_answers

    sample = passkey_prompt(tokenizer, length, depth, seed)
    (score,) = score_answers(model, [sample.ids], [sample.answer_span])
    # What the model predicts at the answer positions, for the log (the score above decides correctness).
    start, end = sample.answer_span
    reset_dynamic_rope(model)
    ids = torch.tensor([sample.ids], device=next(model.parameters()).device)
    predicted = model(input_ids=ids, use_cache=False).logits[0, start - 1 : end - 1].argmax(-1)
    reset_dynamic_rope(model)
    text = tokenizer.decode(predicted.tolist(), skip_special_tokens=True)
    return str(sample.fields["key"]), text.strip(), score.correct


def _untie_if_trained(model: Any) -> bool:
    # peft trains a *copy* of embed_tokens (modules_to_save); in a tied model lm_head still holds the
    # original weight. Saving with tie_word_embeddings=True would silently replace lm_head by the
    # trained embeddings, so the merged model is untied instead. peft 0.21 does this itself in
    # merge_and_unload (with a warning); this keeps older versions right too, and the smoke test checks it.
    inp, outp = model.get_input_embeddings(), model.get_output_embeddings()
    if not getattr(model.config, "tie_word_embeddings", False) or outp is None:
        return False
    if inp.weight.data_ptr() == outp.weight.data_ptr():
        return False
    model.config.tie_word_embeddings = False
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    text.tie_word_embeddings = False
    return True


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
) -> SmokeResult:
    """Merge a run into a standalone model folder that plain transformers loads, after checking it.

    Args:
        run_dir: the run folder written by ``ctxext train``.
        out: the merged model folder to write (must not exist unless ``overwrite``).
        tolerance: max |Δlogit| allowed between the merged model and base + adapter (default by dtype:
            1e-3 for float32, 0.1 for float16, 0.5 for bfloat16).
        smoke_length: tokens per smoke-test sequence (default: the run's target length).
        sequences: random sequences whose logits are compared.
        positions: logit positions compared per sequence.
        device: ``auto`` (CUDA if available), ``cpu``, ``cuda``, ``cuda:1`` …
        dtype: ``auto`` (float32 on CPU, the base's stored dtype on GPU), ``float32``, ``bfloat16``, ``float16``.
        allow_incomplete: merge an unfinished run.
        overwrite: replace an existing ``out``.
        log: where progress lines go.

    Returns:
        The :class:`SmokeResult` (also saved in ``<out>/ctxext_merge.json``).

    Raises:
        InputError: ``out`` exists (without ``overwrite``, or is not an earlier merge output), is or contains
            the run or the base, or the base's weights are damaged or not the ones the run was trained on.
        MergeCheckError: the smoke test failed; nothing is left at ``out``.
    """
    started = time.time()
    _check_settings(tolerance, smoke_length, sequences, positions)
    dev = _device(device)  # a device that does not exist is refused before the run is read
    run_dir, out = Path(run_dir), Path(out)
    run = read_run(run_dir, allow_incomplete=allow_incomplete)
    if not (run_dir / "adapter_config.json").is_file():
        raise InputError(f"run {run_dir} has no adapter_config.json: there is no adapter to merge")
    check_inputs_outside(out, [run_dir])
    check_output(out, MERGED_KIND, overwrite)
    with folder_lock(out):  # one writer per folder, from the first check to the last write
        # The run's reports travel with the merged model for its card: one that does not read fails now, not at push.
        find_reports(run_dir)
        base_dir = _base_folder(run)
        check_inputs_outside(out, [base_dir])
        check_weights_readable(base_dir)
        check_fingerprint(base_dir, run.base_fingerprint, "merge")
        config, resized = _patched_config(base_dir, run_dir, run)
        plan = plan_from_run(run, config)
        torch_dtype = _dtype(dtype, dev, config)
        tol = float(tolerance if tolerance is not None else DEFAULT_TOLERANCE[torch_dtype])
        # A run without a RoPE change (method none) has no target length: check at the configured context.
        length = int(smoke_length or run.target_length or config.max_position_embeddings)

        temperature = run_temperature(run_dir)
        if temperature != 1.0:
            query_projection(str(config.model_type))  # a type the fold does not know is refused before any load
        model = _base_with_adapter(base_dir, run_dir, config, resized, dev, torch_dtype, log)
        if temperature != 1.0:
            set_attention_temperature(model, temperature)
        tokenizer = _tokenizer(run_dir, base_dir)
        probe = _Probe.measure(model, tokenizer, length, sequences, positions, dev, log)
        merged = model.merge_and_unload()
        if _untie_if_trained(merged):
            log("  untied lm_head from the trained embeddings (tie_word_embeddings=false)")
        if temperature != 1.0:
            # The calibrated temperature goes into the weights, so any stack loads it with no setting.
            set_attention_temperature(merged, 1.0)
            fold_attention_temperature(merged, temperature)
            log(f"  attention temperature {temperature:g} (calibration.json) folded into the query projections")
        with atomic_folder(out, kind=MERGED_KIND, overwrite=overwrite) as tmp:
            merged.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            for name in _COPY_FILES:
                if (run_dir / name).is_file():
                    shutil.copy2(run_dir / name, tmp / name)
            _copy_reports(run_dir, tmp)
            del model, merged
            gc.collect()
            result = _check_written(tmp, probe, plan, tokenizer, tol, torch_dtype, dev, log)
            result.seconds = round(time.time() - started, 2)
            result.attention_temperature = temperature
            if not result.ok:
                raise MergeCheckError(
                    "merge check failed: the merged model differs from base + adapter by up to "
                    f"{result.max_abs_diff:.3g} in the logits (tolerance {tol:g}) or its perplexity is not finite "
                    f"({result.ppl:.4g}). Nothing was written to {out}. A tied-embedding or custom-code model may "
                    "need attention; a 16-bit dtype may need a larger --tolerance."
                )
            MergedRecord(run=run, smoke=result.to_dict(), source_run=str(run_dir.resolve())).write(tmp)
        log(f"merged model written to {out} ({result.seconds:.1f} s)")
        return result


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


@dataclass
class _Probe:
    """What base + adapter gives before the merge, for the merged model to reproduce.

    Attributes:
        length: tokens per sequence.
        inputs: random token sequences.
        where: the logit positions compared.
        reference: base + adapter's logits at ``where`` for each sequence.
        text: standard-library source tokens (the perplexity check).
        reference_nll: base + adapter's mean NLL on ``text``.
    """

    length: int
    inputs: list[torch.Tensor]
    where: torch.Tensor
    reference: list[torch.Tensor]
    text: torch.Tensor
    reference_nll: float

    @classmethod
    def measure(
        cls, model: Any, tokenizer: Any, length: int, sequences: int, positions: int, dev: torch.device, log: _Log
    ) -> _Probe:
        """Run base + adapter on seeded random sequences and on real text."""
        gen = torch.Generator().manual_seed(1234)
        vocab = int(model.get_input_embeddings().weight.shape[0])
        inputs = [torch.randint(0, vocab, (1, length), generator=gen) for _ in range(sequences)]
        where = _positions(length, positions)
        log(f"base + adapter: logits at {len(where)} positions of {sequences} random sequences of {length} tokens")
        reference = [_logits_at(model, ids.to(dev), where) for ids in inputs]
        text = text_tokens(tokenizer, length).to(dev)
        ref_nll, _ = _nll(model.get_base_model(), text)
        return cls(length, inputs, where, reference, text, ref_nll)


def _check_written(
    folder: Path, probe: _Probe, plan: Any, tokenizer: Any, tol: float, dtype: torch.dtype, dev: torch.device, log: _Log
) -> SmokeResult:
    """Reload the written folder the way a user will, verify its RoPE and compare it with the probe."""
    from ctxext.models.build import load_weights
    from ctxext.models.sources import config_from_folder
    from ctxext.rope.runtime import verify_model_rope

    log(f"reloading {folder.name} with plain transformers")
    # What a user runs: the folder's own config, from_pretrained, nothing of ctxext's on top.
    reloaded = load_weights(folder, config_from_folder(folder), compute_dtype=dtype, device=dev).eval()
    rope = verify_model_rope(reloaded).summary()
    if plan is not None:
        # Against the run's plan, not the reloaded config: what was trained is what must be published.
        rope = verify_folder(folder, plan)
    diffs, agree, total = [], 0, 0
    for ids, ref in zip(probe.inputs, probe.reference, strict=True):
        got = _logits_at(reloaded, ids.to(dev), probe.where)
        diffs.append((got - ref).abs())
        agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
        total += got.shape[1]
    diff = torch.cat([d.flatten() for d in diffs])
    nll, ppl_tokens = _nll(reloaded, probe.text)
    length = probe.length
    key, answer, correct = passkey_trial(reloaded, tokenizer, length)
    result = SmokeResult(
        length=length,
        sequences=len(probe.inputs),
        positions=len(probe.where),
        max_abs_diff=float(diff.max()),
        mean_abs_diff=float(diff.mean()),
        argmax_agreement=agree / max(total, 1),
        tolerance=tol,
        dtype=str(dtype).replace("torch.", ""),
        device=str(dev),
        ppl=math.exp(nll),
        reference_ppl=math.exp(probe.reference_nll),
        ppl_tokens=ppl_tokens,
        passkey_key=key,
        passkey_answer=answer,
        passkey_correct=correct,
        passkey_depth=0.5,
        rope=rope,
        ok=bool(float(diff.max()) <= tol and math.isfinite(nll)),
    )
    del reloaded
    gc.collect()
    log(
        f"  logits: max |Δ| {result.max_abs_diff:.3g} (tolerance {tol:g}), mean {result.mean_abs_diff:.3g}, "
        f"same argmax {100 * result.argmax_agreement:.2f}%"
    )
    log(
        f"  perplexity @ {length} ({ppl_tokens} tokens of stdlib source): merged {result.ppl:.4g}, "
        f"base + adapter {result.reference_ppl:.4g}"
    )
    log(f"  passkey @ {length}, depth 50%: key {key}, predicted {answer!r} → {'✓' if correct else '✗'}")
    log(f"  runtime RoPE: {rope}")
    return result
