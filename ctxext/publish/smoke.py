"""The merge check: the merged folder, reloaded as a user loads it, against base + adapter — sized to the job.

One random sequence's logits are compared at the full length (the run's target: where the extended RoPE is
used most), the other sequences, the perplexity and the passkey trial run at a shorter check length (the run's
original window by default). At a long target on a CPU every forward costs minutes (SmolLM2-135M: 6 minutes at
32k tokens), so running every check at the target would cost most of an hour for what one forward shows; the
command says up front what it will run and about how long (:class:`ctxext.models.cost.ForwardClock`), names the
flags that change it (``--smoke-length``, ``--check-length``, ``--sequences``), and prints a line per forward.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ctxext.errors import CtxextError
from ctxext.models.load import base_model
from ctxext.progress import duration

_Log = Callable[[str], None]
_Tick = Callable[[], None]


@dataclass
class SmokeResult:
    """What the merge check measured.

    Attributes:
        length: tokens of the first (full-length) test sequence: the target length unless shortened.
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
        ok: the logits agreed within tolerance, the perplexity is finite and tied embeddings stayed one tensor.
        seconds: time taken by the whole merge.
        attention_temperature: the calibrated factor folded into the query projections (1.0: none).
        check_length: tokens of the shorter checks (the other sequences, the perplexity, the passkey trial).
        embeddings: ``tied`` (one tensor after reload), ``separate`` (an untied base) or ``untied`` (a tied base
            whose adapter trained the input embeddings alone: merged untied, deliberately).
        estimated_seconds: the check's estimated time, said before it ran.
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
    check_length: int = 0
    embeddings: str = "separate"
    estimated_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)


@dataclass
class SmokeChecks:
    """What the merge check runs: one sequence at the full length, everything else at the check length.

    Attributes:
        length: tokens of the full-length logits check (``--smoke-length``; default the target).
        check_length: tokens of the other checks (``--check-length``; default the original window).
        sequences: random sequences whose logits are compared (``--sequences``; the first at ``length``).
        positions: logit positions compared per sequence.
        estimated_seconds: filled in by :meth:`announce`.
    """

    length: int
    check_length: int
    sequences: int
    positions: int
    estimated_seconds: float = field(default=0.0)

    def sequence_lengths(self) -> list[int]:
        """The length of each random sequence."""
        return [self.length] + [self.check_length] * (self.sequences - 1)

    def forwards(self) -> list[tuple[int, int]]:
        """``(tokens, projected positions)`` of every forward, base + adapter's then the merged model's."""
        logits = [(n, min(self.positions, n)) for n in self.sequence_lengths()]
        reference = [*logits, (self.check_length, self.check_length)]  # + the perplexity
        return [*reference, *reference, (self.check_length, 8)]  # the merged model's, + the passkey trial

    def announce(self, clock: Any, log: _Log) -> None:
        """Say what will run and about how long, from one measured short forward; keep the estimate."""
        self.estimated_seconds = sum(clock.seconds_at(n, k) for n, k in self.forwards())
        more = self.sequences - 1
        rest = f" and {more} more at {self.check_length:,}" if more else ""
        log(
            f"merge check: logits of 1 random sequence at {self.length:,} tokens (--smoke-length){rest}, perplexity "
            f"and a passkey trial at {self.check_length:,} (--check-length), on both sides: {len(self.forwards())} "
            f"forward passes, about {duration(self.estimated_seconds)} ({clock.note()})"
        )


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
        raise CtxextError(f"not enough standard-library text for a {length}-token perplexity check; use --check-length")
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
    """One passkey retrieval at ``length`` tokens (prompt + answer), scored teacher-forced in one forward pass.

    Correct iff every answer token is the argmax at the position before it — exactly what greedy decoding
    would produce, with no KV cache and no ``generation_config`` (see :mod:`ctxext.scoring.answers`).

    Args:
        model: a causal LM.
        tokenizer: its tokenizer.
        length: total tokens (prompt + answer).
        seed: chooses the key.
        depth: where the key is hidden.

    Returns:
        ``(key, the model's argmax continuation at the answer positions, correct)``.
    """
    sample = passkey_prompt(tokenizer, length, depth, seed)
    start, end = sample.answer_span
    ids = torch.tensor([sample.ids], device=next(model.parameters()).device)
    predicted = _logits_at(model, ids, torch.arange(start - 1, end - 1))[0].argmax(-1)
    correct = predicted.tolist() == list(sample.ids[start:end])
    text = tokenizer.decode(predicted.tolist(), skip_special_tokens=True)
    return str(sample.fields["key"]), text.strip(), correct


@dataclass
class Probe:
    """What base + adapter gives before the merge, for the merged model to reproduce.

    Attributes:
        checks: what runs.
        inputs: random token sequences (the first at the full length).
        where: the logit positions compared, per sequence.
        reference: base + adapter's logits at ``where`` for each sequence.
        text: standard-library source tokens (the perplexity check).
        reference_nll: base + adapter's mean NLL on ``text``.
    """

    checks: SmokeChecks
    inputs: list[torch.Tensor]
    where: list[torch.Tensor]
    reference: list[torch.Tensor]
    text: torch.Tensor
    reference_nll: float

    @classmethod
    def measure(
        cls, model: Any, tokenizer: Any, checks: SmokeChecks, dev: torch.device, log: _Log, tick: _Tick
    ) -> Probe:
        """Run the run as it loads (base + adapter, or a full fine-tune) on seeded random sequences and real text."""
        gen = torch.Generator().manual_seed(1234)
        vocab = int(model.get_input_embeddings().weight.shape[0])
        inputs = [torch.randint(0, vocab, (1, n), generator=gen) for n in checks.sequence_lengths()]
        where = [_positions(n, checks.positions) for n in checks.sequence_lengths()]
        log("the run before the merge: the reference logits and perplexity")
        reference = []
        for ids, at in zip(inputs, where, strict=True):
            reference.append(_logits_at(model, ids.to(dev), at))
            tick()
        text = text_tokens(tokenizer, checks.check_length).to(dev)
        ref_nll, _ = _nll(base_model(model), text)
        tick()
        return cls(checks, inputs, where, reference, text, ref_nll)


def check_written(
    folder: Path,
    probe: Probe,
    plan: Any,
    tokenizer: Any,
    tol: float,
    dtype: torch.dtype,
    dev: torch.device,
    expect_tied: bool,
    log: _Log,
    tick: _Tick,
) -> SmokeResult:
    """Reload the written folder the way a user will, verify its RoPE and tie, and compare it with the probe.

    Args:
        folder: the written merged folder.
        probe: base + adapter's reference outputs.
        plan: the run's RoPE plan (``None``: the reloaded config is checked against itself).
        tokenizer: the run's tokenizer.
        tol: the logit tolerance.
        dtype: the weights' dtype.
        dev: where to run.
        expect_tied: the embeddings must be one tensor after reload.
        log: where result lines go.
        tick: advances the progress display by one forward.
    """
    from ctxext.models.build import load_weights
    from ctxext.models.embeddings import embeddings_tied
    from ctxext.models.sources import config_from_folder
    from ctxext.rope.runtime import verify_model_rope
    from ctxext.rope.verify import verify_folder

    log(f"reloading {folder.name} with plain transformers")
    # What a user runs: the folder's own config, from_pretrained, nothing of ctxext's on top.
    reloaded = load_weights(folder, config_from_folder(folder), compute_dtype=dtype, device=dev).eval()
    rope = verify_model_rope(reloaded).summary()
    if plan is not None:
        # Against the run's plan, not the reloaded config: what was trained is what must be published.
        rope = verify_folder(folder, plan)
    tied = embeddings_tied(reloaded)
    diffs, agree, total = [], 0, 0
    for ids, at, ref in zip(probe.inputs, probe.where, probe.reference, strict=True):
        got = _logits_at(reloaded, ids.to(dev), at)
        tick()
        diffs.append((got - ref).abs().flatten())
        agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
        total += got.shape[1]
    diff = torch.cat(diffs)
    nll, ppl_tokens = _nll(reloaded, probe.text)
    tick()
    checks = probe.checks
    key, answer, correct = passkey_trial(reloaded, tokenizer, checks.check_length)
    tick()
    result = SmokeResult(
        length=checks.length,
        sequences=len(probe.inputs),
        positions=checks.positions,
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
        ok=bool(float(diff.max()) <= tol and math.isfinite(nll) and (tied or not expect_tied)),
        check_length=checks.check_length,
        embeddings="tied" if tied else "separate",
        estimated_seconds=round(checks.estimated_seconds, 1),
    )
    del reloaded
    gc.collect()
    _log_result(result, log)
    return result


def _log_result(result: SmokeResult, log: _Log) -> None:
    log(
        f"  logits: max |Δ| {result.max_abs_diff:.3g} (tolerance {result.tolerance:g}), mean "
        f"{result.mean_abs_diff:.3g}, same argmax {100 * result.argmax_agreement:.2f}%"
    )
    log(
        f"  perplexity @ {result.check_length} ({result.ppl_tokens} tokens of stdlib source): merged "
        f"{result.ppl:.4g}, before {result.reference_ppl:.4g}"
    )
    log(
        f"  passkey @ {result.check_length}, depth 50%: key {result.passkey_key}, predicted "
        f"{result.passkey_answer!r} → {'✓' if result.passkey_correct else '✗'}"
    )
    if result.embeddings == "tied":
        log("  embeddings: lm_head is the input embedding matrix (tied, one tensor) after reload")
    log(f"  runtime RoPE: {result.rope}")
