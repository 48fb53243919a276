"""Grow ``builtin:grown-code-64``: a small Llama pretrained here, at a 64-token window, on stdlib code.

No real checkpoint can be downloaded on these machines and a random model says nothing about
context extension, so ctxext grows its own. This script is the whole recipe, deterministic (seeded):

1. split the Python standard library's source (:func:`ctxext.models.builtin.stdlib_files`) into training
   files and held-out files (every file whose ``sha1(path relative to the stdlib root) mod 10 == 0``);
2. train a byte-level BPE tokenizer on the training files only;
3. pretrain a ~4.2M-parameter Llama (4 layers, hidden 256, 4 heads, rope_theta 10000) at a 64-token
   window on the training files, where a share of sequences carry a key/value needle
   (``KEY_ab = 68310`` on one line, ``assert KEY_ab == 68310`` later) and a share carry a repeated
   span, at distances spread uniformly over the window, so that the model learns to use its whole
   window (a plain-code model of this size uses only its last few dozen tokens);
4. save model + tokenizer (fp32 safetensors) to ``ctxext/resources/grown-code-64/``;
5. measure on the held-out files: (1) context use (perplexity on the same tokens with the full window
   versus one eighth of it, bootstrap CI over documents); (2) needle retrieval by depth inside the
   window; (3) both at 4x the window, unscaled and with training-free RoPE methods.

Usage::

    nice -n 10 python benchmarks/grow_base.py                 # grow + measure (~40 min on 2 cores)
    python benchmarks/grow_base.py --measure-only             # re-measure the saved model (~2 min)
    python benchmarks/grow_base.py --steps 20 --out /tmp/g    # smoke run
    # builtin:grown-code-64-mk: two further stages on windows with 2-4 keys, asking for one, with an extra
    # loss on the asked key's answer (without it, 3,600 steps of such windows never taught key selection):
    python benchmarks/grow_base.py --init-from ctxext/resources/grown-code-64 --out /tmp/grow-mka --skip-measure \
        --steps 800 --lr 1e-3 --warmup 20 --needle-share 0.2 --multikey-share 0.4 --answer-weight 1.0 --seed 5
    python benchmarks/grow_base.py --init-from /tmp/grow-mka --out ctxext/resources/grown-code-64-mk \
        --steps 600 --lr 7e-4 --warmup 20 --needle-share 0.2 --multikey-share 0.5 --answer-weight 2.0 --seed 6

Everything measured is printed and written to ``grow_report.json`` / ``grow_report.md`` in the
output folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctxext.models.builtin import stdlib_files, train_bpe_tokenizer

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "ctxext" / "data" / "grown-code-64"


@dataclass
class Settings:
    """Every knob of the recipe; each is also a ``--flag`` (underscores become dashes)."""

    seed: int = 0
    threads: int = 2
    # Tokenizer and split.
    vocab_size: int = 2048
    heldout_mod: int = 10  # a file is held out when sha1(relative path) % heldout_mod == 0
    # Model.
    window: int = 64
    hidden: int = 256
    intermediate: int = 688
    layers: int = 4
    heads: int = 4
    rope_theta: float = 10000.0
    # Training mixture: the rest of the sequences are plain code.
    needle_share: float = 0.30
    repeat_share: float = 0.10
    # Multi-key windows: 2 to 1 + max_distractors needles with distinct names, the query asks for one of
    # them (a later stage: the model learns to select a key by its name, RULER's MK-NIAH in-window).
    multikey_share: float = 0.0
    max_distractors: int = 3
    # Weight of an extra loss on the answer tokens of the multi-key windows alone (their mean NLL), added to
    # the LM loss of all tokens. Measured: with the LM loss alone (the answer is ~5 of 64 tokens) 3,600 steps
    # of 60-70 % multi-key windows never taught the model to select the key (2 distractors: 23-46 % right);
    # 600 steps of answer-only loss on multi-key windows did (97 %). 0: the LM loss alone.
    answer_weight: float = 0.0
    # Key names: "letters" (KEY_ab, two lowercase letters, often two tokens) or "words" (KEY_path: a
    # lowercase vocabulary entry that stays one token after ``KEY_``, so a name is matched by one token).
    key_names: str = "letters"
    repeat_min: int = 8
    repeat_max: int = 16
    # Optimisation (fp32, AdamW, linear warm-up then cosine to min_lr_ratio x lr).
    steps: int = 1300
    batch: int = 32
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    log_every: int = 50
    eval_every: int = 500
    # Stage 2: continue with more needles at a lower lr (fresh AdamW, same batch). Measured here: after
    # stage 1 alone (2.7M tokens) the model copied the first digit of a needle but retrieved 0-3%;
    # stage 2 (0.8M tokens) took it to 97-100% at every depth. 0 steps: no stage 2.
    stage2_steps: int = 400
    stage2_needle_share: float = 0.5
    stage2_lr: float = 1e-3
    stage2_warmup: int = 20
    stage2_seed: int = 1
    # Measurements.
    needle_trials: int = 30
    depths: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    extend_factor: int = 4
    methods: tuple[str, ...] = ("none", "linear", "ntk", "dynamic", "yarn")
    short_context: int = 8  # the cut context of measurement (1): one eighth of the window
    max_targets_per_doc: int = 512
    bootstrap: int = 2000
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- data


def split_files(mod: int) -> tuple[Path, list[Path], list[Path]]:
    """Deterministic train / held-out split of the standard library's source files.

    Args:
        mod: a file is held out when ``sha1(path relative to the stdlib root) % mod == 0``.

    Returns:
        (stdlib root, training files, held-out files), each list sorted by path.
    """
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    train, heldout = [], []
    for path in stdlib_files():
        rel = path.relative_to(root).as_posix()
        digest = int(hashlib.sha1(rel.encode()).hexdigest(), 16)
        (heldout if digest % mod == 0 else train).append(path)
    return root, train, heldout


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(files: list[Path], vocab_size: int):
    """Byte-level BPE trained on ``files`` only, wrapped like a Llama tokenizer (adds ``<s>``)."""
    return train_bpe_tokenizer((read(p) for p in files), vocab_size)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_files(tokenizer, files: list[Path]) -> list[np.ndarray]:
    """Token ids of each file (no BOS), in file order."""
    out = tokenizer([read(p) for p in files], add_special_tokens=False)["input_ids"]
    return [np.asarray(ids, dtype=np.int64) for ids in out]


class Needles:
    """Key/value needles: ``KEY_xx = NNNNN`` early, ``assert KEY_xx == NNNNN`` later.

    The ByteLevel pre-tokenizer splits ``assert KEY_ab == 68310`` before `` 68310``, so the ids of
    the prompt ``assert KEY_ab ==`` are exactly a prefix of the ids of the full query line: the
    training sequences and the retrieval prompts agree token for token.
    """

    def __init__(self, tokenizer, key_names: str = "letters"):
        self.tokenizer = tokenizer
        self.words: list[str] = []
        if key_names == "words":
            vocab = sorted(tokenizer.get_vocab())
            self.words = [w for w in vocab if w.isascii() and w.isalpha() and w.islower() and 3 <= len(w) <= 7]
        ids = range(len(tokenizer))
        # Tokens that end a line (ByteLevel joins "\n" with the next line's indentation).
        self.line_end = np.array(["\n" in tokenizer.decode([i]) for i in ids], dtype=bool)
        self.newline = encode(tokenizer, "\n")

    def sample(self, rng: np.random.Generator, key: str | None = None) -> tuple[list[int], list[int], list[int]]:
        """One needle: (needle line ids, query prompt ids, answer ids); ``key`` drawn unless given."""
        key = key or self.draw_key(rng)
        value = int(rng.integers(10000, 100000))
        needle = encode(self.tokenizer, f"{key} = {value}\n")
        prompt = encode(self.tokenizer, f"assert {key} ==")
        answer = encode(self.tokenizer, f" {value}")
        return needle, prompt, answer

    def draw_key(self, rng: np.random.Generator) -> str:
        """A random ``KEY_xy`` name (two lowercase letters, or one vocabulary word)."""
        if self.words:
            return "KEY_" + self.words[int(rng.integers(len(self.words)))]
        return "KEY_" + "".join(chr(97 + int(c)) for c in rng.integers(0, 26, size=2))

    def boundaries(self, code: np.ndarray) -> np.ndarray:
        """Positions in ``code`` where a new line starts (0 included): where a needle may go."""
        return np.concatenate([[0], np.nonzero(self.line_end[code])[0] + 1])


def snap(positions: np.ndarray, x: float) -> int:
    """The line start nearest to ``x``."""
    return int(positions[np.argmin(np.abs(positions - x))])


class TrainingSequences:
    """Seeded sampler of training windows: plain code, key/value needles and repeated spans."""

    def __init__(self, stream: np.ndarray, needles: Needles, s: Settings, seed: int):
        self.stream, self.needles, self.s = stream, needles, s
        self.rng = np.random.default_rng(seed)

    def code(self, n: int) -> np.ndarray:
        start = int(self.rng.integers(0, len(self.stream) - n))
        return self.stream[start : start + n]

    def needle_sequence(self) -> np.ndarray:
        w = self.s.window
        needle, prompt, answer = self.needles.sample(self.rng)
        query = prompt + answer + encode(self.needles.tokenizer, "\n")
        n = w - len(needle) - len(query)
        code = self.code(n)
        lines = self.needles.boundaries(code)
        # Distance between needle and query uniform over the window, then both snapped to line starts.
        dist = self.rng.uniform(0, n)
        first = snap(lines, self.rng.uniform(0, n - dist))
        second = max(first, snap(lines, first + dist))
        seq = np.concatenate([code[:first], needle, code[first:second], query, code[second:]])
        return seq

    def multikey_sequence(self, count: int | None = None) -> tuple[np.ndarray, tuple[int, int]]:
        """Several needles with distinct names, then the query for one of them, at line starts.

        Args:
            count: how many needles (default: drawn from 2 to ``1 + max_distractors``).

        Returns the window and the ``(start, end)`` of the queried key's answer tokens in it.
        """
        w = self.s.window
        count = int(self.rng.integers(2, 2 + self.s.max_distractors)) if count is None else count
        keys: list[str] = []
        while len(keys) < count:
            key = self.needles.draw_key(self.rng)
            if key not in keys:
                keys.append(key)
        target, *others = [self.needles.sample(self.rng, key) for key in keys]
        _, prompt, answer = target
        query = prompt + answer + encode(self.needles.tokenizer, "\n")
        # Four needles and a query may not fit a 64-token window: drop distractors until 8 code tokens fit.
        while others and w - len(target[0]) - sum(len(d[0]) for d in others) - len(query) < 8:
            others.pop()
        drawn = [target, *others]
        drawn = [drawn[i] for i in self.rng.permutation(len(drawn))]
        count = len(drawn)
        n = w - sum(len(d[0]) for d in drawn) - len(query)
        code = self.code(n)
        lines = self.needles.boundaries(code)
        # Needles at sorted random line starts, the query after the last one.
        cuts = sorted(snap(lines, x) for x in self.rng.uniform(0, n, size=count + 1))
        parts, last, length = [], 0, 0
        for cut, piece in zip(cuts, [d[0] for d in drawn] + [query], strict=True):
            parts += [code[last:cut], piece]
            length += cut - last
            answer_start = length + len(prompt)
            length += len(piece)
            last = cut
        return np.concatenate([*parts, code[last:]]), (answer_start, answer_start + len(answer))

    def repeat_sequence(self) -> np.ndarray:
        w = self.s.window
        code = self.code(w)
        span = int(self.rng.integers(self.s.repeat_min, self.s.repeat_max + 1))
        dist = int(self.rng.integers(span, w - span + 1))
        start = int(self.rng.integers(0, w - span - dist + 1))
        seq = np.concatenate([code[: start + dist], code[start : start + span], code[start + dist :]])
        return seq[:w]

    def batch_with_answers(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of windows and a mask of the multi-key answer tokens in it (False elsewhere)."""
        rows = []
        answers = np.zeros((size, self.s.window), dtype=bool)
        for r in range(size):
            u = self.rng.random()
            if u < self.s.needle_share:
                rows.append(self.needle_sequence())
            elif u < self.s.needle_share + self.s.repeat_share:
                rows.append(self.repeat_sequence())
            elif u < self.s.needle_share + self.s.repeat_share + self.s.multikey_share:
                seq, (a0, a1) = self.multikey_sequence()
                rows.append(seq)
                answers[r, a0:a1] = True
            else:
                rows.append(self.code(self.s.window))
        return torch.from_numpy(np.stack(rows)), torch.from_numpy(answers)


# ---------------------------------------------------------------- model and training


def build_model(s: Settings, tokenizer):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.heads,
        max_position_embeddings=s.window,
        rope_theta=s.rope_theta,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(s.seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def training_loss(model, batch: torch.Tensor, answers: torch.Tensor, answer_weight: float) -> torch.Tensor:
    """The LM loss of every token, plus ``answer_weight`` × the mean NLL of the multi-key answer tokens."""
    if answer_weight <= 0 or not bool(answers.any()):
        return model(input_ids=batch, labels=batch).loss
    logits = model(input_ids=batch).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
    # Token t is predicted at position t - 1: the answer mask shifts with the targets.
    return nll.mean() + answer_weight * nll[answers[:, 1:]].mean()


def lr_at(step: int, s: Settings) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def heldout_loss(model, windows: torch.Tensor) -> float:
    model.eval()
    losses = [model(input_ids=chunk, labels=chunk).loss.item() for chunk in windows.split(64)]
    model.train()
    return float(np.mean(losses))


def pretrain(s: Settings, tokenizer, train_docs: list[np.ndarray], heldout_docs: list[np.ndarray], log, model=None):
    """Pretrain the model (a new one, or ``model`` to continue); returns (model, training record)."""
    sep = np.asarray(encode(tokenizer, "\n\n"), dtype=np.int64)
    stream = np.concatenate([x for doc in train_docs for x in (doc, sep)])
    needles = Needles(tokenizer, s.key_names)
    data = TrainingSequences(stream, needles, s, seed=s.seed + 1)
    # A fixed held-out set of plain code windows and needle windows, to watch the run.
    held_stream = np.concatenate([x for doc in heldout_docs for x in (doc, sep)])
    watch = TrainingSequences(held_stream, needles, s, seed=s.seed + 2)
    watch_plain = torch.from_numpy(np.stack([watch.code(s.window) for _ in range(256)]))
    watch_needle = torch.from_numpy(np.stack([watch.needle_sequence() for _ in range(256)]))

    model = model if model is not None else build_model(s, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f}M parameters; training stream {len(stream):,} tokens")
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=s.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    model.train()
    history = []
    t0 = time.time()
    window_loss = []
    for step in range(s.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s)
        batch, answers = data.batch_with_answers(s.batch)
        loss = training_loss(model, batch, answers, s.answer_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        window_loss.append(loss.item())
        done = step + 1
        if done % s.log_every == 0 or done == s.steps:
            elapsed = time.time() - t0
            tokens = done * s.batch * s.window
            entry = {
                "step": done,
                "train_loss": float(np.mean(window_loss)),
                "lr": lr_at(step, s),
                "elapsed_s": round(elapsed, 1),
                "tokens": tokens,
            }
            window_loss = []
            if done % s.eval_every == 0 or done == s.steps:
                entry["heldout_loss_plain"] = heldout_loss(model, watch_plain)
                entry["heldout_loss_needle_seqs"] = heldout_loss(model, watch_needle)
            history.append(entry)
            eta = elapsed / done * (s.steps - done)
            log(
                f"step {done}/{s.steps} loss {entry['train_loss']:.3f} lr {entry['lr']:.2e} "
                f"{tokens / elapsed:,.0f} tok/s elapsed {elapsed / 60:.1f} min eta {eta / 60:.1f} min"
                + (
                    f" | held-out loss plain {entry['heldout_loss_plain']:.3f}"
                    f" needle-seqs {entry['heldout_loss_needle_seqs']:.3f}"
                    if "heldout_loss_plain" in entry
                    else ""
                )
            )
    seconds = time.time() - t0
    record = {
        "parameters": n_params,
        "train_stream_tokens": int(len(stream)),
        "tokens_seen": s.steps * s.batch * s.window,
        "seconds": round(seconds, 1),
        "history": history,
    }
    model.eval()
    return model, record


def save_model(model, tokenizer, out: Path, extra_files: dict[str, str]) -> None:
    """Write model + tokenizer to ``out`` through a temporary folder renamed at the end."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for name, text in extra_files.items():
            (tmp / name).write_text(text)
        # mkdtemp makes a private folder; package data must be readable by everyone.
        tmp.chmod(0o755)
        for child in tmp.iterdir():
            child.chmod(0o644)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- measurements


@torch.no_grad()
def target_nll(model, doc: np.ndarray, lo: int, hi: int, window: int, stride: int) -> np.ndarray:
    """NLL of tokens ``doc[lo:hi]``, each scored with ``window - stride .. window - 1`` tokens of context.

    Sliding windows of ``window`` tokens, moved by ``stride``; only the last ``stride`` tokens of each
    window are scored, so every scored token sees at least ``window - stride`` earlier tokens.
    """
    assert lo >= window - stride and (hi - lo) % stride == 0
    ends = list(range(lo + stride, hi + 1, stride))
    x = torch.from_numpy(np.stack([doc[e - window : e] for e in ends]))
    out = []
    for chunk in x.split(max(1, 8192 // window)):
        logits = model(input_ids=chunk).logits[:, -stride - 1 : -1].float()
        logp = torch.log_softmax(logits, dim=-1)
        tgt = chunk[:, -stride:]
        out.append(-logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1).reshape(-1))
    return torch.cat(out).numpy()


def context_use(model, docs: list[np.ndarray], lo: int, settings: list[tuple[str, int, int]], s: Settings):
    """Per-document NLL sums of the same target tokens under several context settings.

    Args:
        lo: first target position in each document (documents shorter than ``lo + 64`` are skipped).
        settings: (name, window, stride) triples.

    Returns:
        {name: array of per-document NLL sums}, array of per-document target counts.
    """
    from ctxext.rope.core import reset_dynamic_rope

    sums: dict[str, list[float]] = {name: [] for name, _, _ in settings}
    counts = []
    for doc in docs:
        n = min(len(doc) - lo, s.max_targets_per_doc) // 64 * 64
        if n <= 0:
            continue
        counts.append(n)
        for name, window, stride in settings:
            reset_dynamic_rope(model)
            sums[name].append(float(target_nll(model, doc, lo, lo + n, window, stride).sum()))
    return {k: np.asarray(v) for k, v in sums.items()}, np.asarray(counts, dtype=np.float64)


def bootstrap_gap(a: np.ndarray, b: np.ndarray, counts: np.ndarray, reps: int, seed: int) -> dict[str, float]:
    """Mean per-token NLL gap ``a - b`` with a 95% bootstrap CI over documents, and ppl ratio."""
    rng = np.random.default_rng(seed)
    gap = (a.sum() - b.sum()) / counts.sum()
    idx = rng.integers(0, len(counts), size=(reps, len(counts)))
    gaps = (a[idx].sum(1) - b[idx].sum(1)) / counts[idx].sum(1)
    lo, hi = np.percentile(gaps, [2.5, 97.5])
    return {
        "nll_gap": float(gap),
        "nll_gap_ci95": [float(lo), float(hi)],
        "ppl_ratio": float(math.exp(gap)),
        "ppl_ratio_ci95": [float(math.exp(lo)), float(math.exp(hi))],
    }


@torch.no_grad()
def needle_accuracy(model, needles: Needles, docs: list[np.ndarray], length: int, s: Settings, seed: int):
    """Needle retrieval by depth in prompts of ``length`` tokens (answer included) from held-out code.

    Exact match under greedy decoding, computed by teacher forcing: greedy decoding produces the
    answer exactly when every answer token is the arg-max given the correct earlier tokens.

    Returns:
        {depth: accuracy}, and the mean needle-to-query distance (tokens) per depth.
    """
    from ctxext.rope.core import reset_dynamic_rope

    rng = np.random.default_rng(seed)
    long_docs = [d for d in docs if len(d) >= length]
    acc, dist = {}, {}
    for depth in s.depths:
        seqs, spans, gaps = [], [], []
        for _ in range(s.needle_trials):
            needle, prompt, answer = needles.sample(rng)
            # The query starts a new line, as in training (where it is placed at a line start).
            prompt = needles.newline + prompt
            n = length - len(needle) - len(prompt) - len(answer)
            doc = long_docs[int(rng.integers(0, len(long_docs)))]
            start = int(rng.integers(0, len(doc) - n + 1))
            code = doc[start : start + n]
            at = snap(needles.boundaries(code), depth * n)
            seqs.append(np.concatenate([code[:at], needle, code[at:], prompt, answer]))
            spans.append(len(answer))
            # Tokens from the start of the needle line to the first answer token.
            gaps.append(len(needle) + n - at + len(prompt))
        ok = []
        x = torch.from_numpy(np.stack(seqs))
        for first in range(0, len(seqs), 32):
            chunk = x[first : first + 32]
            reset_dynamic_rope(model)
            logits = model(input_ids=chunk).logits
            for row, k in enumerate(spans[first : first + 32]):
                pred = logits[row, -k - 1 : -1].argmax(-1)
                ok.append(bool(torch.equal(pred, chunk[row, -k:])))
        acc[depth] = float(np.mean(ok))
        dist[depth] = float(np.mean(gaps))
    return acc, dist


def multikey_accuracy(model, needles: Needles, docs: list[np.ndarray], s: Settings, keys: int, seed: int):
    """Multi-key retrieval inside the window: ``keys`` needles with distinct names in held-out code, the
    query asks for one (the training stages' windows, drawn from held-out files); teacher-forced exact match.

    Returns:
        (accuracy, trials): every trial's window has exactly ``keys`` needles unless they cannot fit.
    """
    from ctxext.evaluation.answer_scoring import score_answers

    data = TrainingSequences(np.concatenate(docs), needles, s, seed)
    trials = s.needle_trials * len(s.depths)
    drawn = [data.multikey_sequence(count=keys) for _ in range(trials)]
    scores = score_answers(model, [seq.tolist() for seq, _ in drawn], [span for _, span in drawn])
    return float(np.mean([score.correct for score in scores])), trials


def load_saved(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32)
    return model.eval(), tokenizer


def patched(path: Path, method: str, target: int):
    from ctxext.rope.core import patch_model

    model, _ = load_saved(path)
    if method != "none":
        patch_model(model, method, target)
    return model


def measure(path: Path, s: Settings, log) -> dict[str, Any]:
    """Measurements (1)-(3) of the saved model at ``path`` on the held-out files."""
    model, tokenizer = load_saved(path)
    root, _, heldout = split_files(s.heldout_mod)
    docs = encode_files(tokenizer, heldout)
    needles = Needles(tokenizer)
    w, big, cut = s.window, s.window * s.extend_factor, s.short_context
    out: dict[str, Any] = {"heldout_files": len(heldout), "heldout_tokens": int(sum(len(d) for d in docs))}
    t0 = time.time()

    # (1) context use inside the window: same targets, full window vs one eighth of it.
    full = (f"ctx {w // 4 * 3}-{w - 1}", w, w // 4)
    short = (f"ctx {cut // 2}-{cut - 1}", cut, cut // 2)
    sums, counts = context_use(model, docs, w, [full, short], s)
    cu = {
        "targets": int(counts.sum()),
        "documents": len(counts),
        "ppl_full": float(math.exp(sums[full[0]].sum() / counts.sum())),
        "ppl_short": float(math.exp(sums[short[0]].sum() / counts.sum())),
        "full_context": full[0],
        "short_context": short[0],
        **bootstrap_gap(sums[short[0]], sums[full[0]], counts, s.bootstrap, s.seed),
    }
    out["context_use"] = cu
    log(
        f"(1) context use: ppl {cu['ppl_full']:.2f} with {full[0]} vs {cu['ppl_short']:.2f} with {short[0]} "
        f"on {cu['targets']} targets / {cu['documents']} docs; ratio {cu['ppl_ratio']:.3f} "
        f"(95% CI {cu['ppl_ratio_ci95'][0]:.3f}-{cu['ppl_ratio_ci95'][1]:.3f})"
    )

    # (2) needle retrieval by depth inside the window.
    acc, dist = needle_accuracy(model, needles, docs, w, s, seed=s.seed + 10)
    out["needle_in_window"] = {"length": w, "trials_per_depth": s.needle_trials, "accuracy": acc, "distance": dist}
    log(f"(2) needle @ {w}: " + " ".join(f"{d:.0%}:{a:.0%}" for d, a in acc.items()))
    mk, mk_trials = multikey_accuracy(model, needles, docs, s, keys=3, seed=s.seed + 30)
    out["multikey_in_window"] = {"length": w, "keys": 3, "trials": mk_trials, "accuracy": mk}
    log(f"(2b) multi-key @ {w}, 3 keys (2 distractors): {mk:.0%} of {mk_trials}")

    # (3) at extend_factor x the window: unscaled and with training-free methods.
    methods = {}
    for method in s.methods:
        m = patched(path, method, big)
        acc_big, dist_big = needle_accuracy(m, needles, docs, big, s, seed=s.seed + 20)
        acc_small, _ = needle_accuracy(m, needles, docs, w, s, seed=s.seed + 10)
        settings = [
            (f"ctx {big // 4 * 3}-{big - 1}", big, big // 4),
            (f"ctx {w // 4 * 3}-{w - 1}", w, w // 4),
            (f"ctx {cut // 2}-{cut - 1}", cut, cut // 2),
        ]
        sums_b, counts_b = context_use(m, docs, big, settings, s)
        ppl = {name: float(math.exp(sums_b[name].sum() / counts_b.sum())) for name, _, _ in settings}
        methods[method] = {
            "needle_accuracy_at_extended": acc_big,
            "needle_distance_at_extended": dist_big,
            "needle_accuracy_in_window": acc_small,
            "ppl_by_context": ppl,
            "targets": int(counts_b.sum()),
            "documents": len(counts_b),
            "extended_vs_window": bootstrap_gap(
                sums_b[settings[0][0]], sums_b[settings[1][0]], counts_b, s.bootstrap, s.seed
            ),
            "window_vs_cut": bootstrap_gap(
                sums_b[settings[2][0]], sums_b[settings[1][0]], counts_b, s.bootstrap, s.seed
            ),
        }
        log(
            f"(3) {method:8s} needle @ {big}: "
            + " ".join(f"{d:.0%}:{a:.0%}" for d, a in acc_big.items())
            + f" | @ {w} mean {np.mean(list(acc_small.values())):.0%} | ppl "
            + ", ".join(f"{k}: {v:.2f}" for k, v in ppl.items())
        )
    out["extended"] = {"length": big, "factor": s.extend_factor, "methods": methods}
    out["measure_seconds"] = round(time.time() - t0, 1)
    return out


# ---------------------------------------------------------------- report


def multikey_lines(m: dict[str, Any]) -> list[str]:
    """The report's multi-key section (none for a report measured before it existed)."""
    mk = m.get("multikey_in_window")
    if mk is None:
        return []
    return [
        f"## (2b) Multi-key retrieval inside the window ({mk['length']} tokens)",
        "",
        f"{mk['trials']} windows of held-out code with {mk['keys']} `KEY_xx = NNNNN` needles (distinct names, "
        f"random line starts), the query `assert KEY_xx ==` asks for one; greedy exact match: "
        f"**{mk['accuracy']:.0%}** (a random pick among the keys: {1 / mk['keys']:.0%}).",
        "",
    ]


def multikey_phrase(ss: dict[str, Any]) -> str:
    """The multi-key part of a stage's data, for the report ("" for a stage without multi-key windows)."""
    share = ss.get("multikey_share", 0.0)
    if not share:
        return ""
    weight = ss.get("answer_weight", 0.0)
    loss = f", their answer tokens' mean NLL added to the loss x {weight:g}" if weight else ""
    return (
        f"{share:.0%} windows with 2-{1 + ss.get('max_distractors', 3)} keys ({ss.get('key_names', 'letters')}) "
        f"asking for one{loss}, "
    )


def markdown(report: dict[str, Any], name: str = "grown-code-64") -> str:
    s = report["settings"]
    lines = [f"# {name}: how it was grown and what it measures", ""]
    if "train_command" in report:
        lines.append(f"Grown with: `{report['train_command']}`  ")
    lines.append(f"Last run: `{report['command']}`  ")
    lines.append(f"Date: {report['date']}; machine: {report['machine']}")
    lines.append("")
    if "training" in report:
        t = report["training"]
        stages = [*report.get("earlier_stages", []), {"settings": s, "training": t}]
        lines += [
            "## Training",
            "",
            f"- {t['parameters'] / 1e6:.2f}M parameters: Llama, {s['layers']} layers, hidden {s['hidden']}, "
            f"{s['heads']} heads, MLP {s['intermediate']}, rope_theta {s['rope_theta']:g}, "
            f"window (max_position_embeddings) {s['window']}, fp32.",
            f"- Tokenizer: byte-level BPE, {s['vocab_size']} tokens, trained on the training files only.",
            f"- Data: {report['split']['train_files']} standard-library files ({t['train_stream_tokens']:,} tokens); "
            f"{report['split']['heldout_files']} held out (sha1(relative path) % {s['heldout_mod']} == 0).",
        ]
        for i, stage in enumerate(stages, 1):
            ss, tt = stage["settings"], stage["training"]
            last = [h for h in tt["history"] if "heldout_loss_plain" in h][-1]
            lines += [
                f"- Stage {i}"
                + (f" (`{stage['train_command']}`)" if "train_command" in stage else "")
                + f": {ss['needle_share']:.0%} key/value needles, {ss['repeat_share']:.0%} repeated spans "
                f"({ss['repeat_min']}-{ss['repeat_max']} tokens), "
                + multikey_phrase(ss)
                + "the rest plain code, distances uniform over the "
                f"window; AdamW (betas 0.9/0.95, weight decay {ss['weight_decay']}), lr {ss['lr']:g}, "
                f"{ss['warmup']} warm-up steps, cosine to {ss['min_lr_ratio']:g}x; {ss['steps']} steps x "
                f"{ss['batch']} sequences x {ss['window']} tokens = {tt['tokens_seen']:,} tokens; "
                f"{tt['seconds'] / 60:.1f} min; seed {ss['seed']}. Held-out loss at the end: plain code "
                f"{last['heldout_loss_plain']:.3f} (ppl {math.exp(last['heldout_loss_plain']):.1f}), "
                f"needle sequences {last['heldout_loss_needle_seqs']:.3f}."
            ]
        total_tokens = sum(st["training"]["tokens_seen"] for st in stages)
        total_min = sum(st["training"]["seconds"] for st in stages) / 60
        lines += [f"- In all: {total_tokens:,} training tokens, {total_min:.1f} min of training.", ""]
    m = report.get("measurements")
    if m:
        cu = m["context_use"]
        lines += [
            "## (1) Context use inside the window",
            "",
            f"Same {cu['targets']:,} target tokens of {cu['documents']} held-out files: ppl "
            f"**{cu['ppl_full']:.2f}** with {cu['full_context']} tokens of context vs **{cu['ppl_short']:.2f}** "
            f"with {cu['short_context']}; ratio {cu['ppl_ratio']:.3f} (95% bootstrap CI over documents "
            f"{cu['ppl_ratio_ci95'][0]:.3f}-{cu['ppl_ratio_ci95'][1]:.3f}).",
            "",
        ]
        ext = m["extended"]
        depths = list(m["needle_in_window"]["accuracy"])
        head = "| | " + " | ".join(f"{float(d):.0%}" for d in depths) + " |"
        sep = "|---" * (len(depths) + 1) + "|"
        lines += [
            f"## (2) Needle retrieval by depth inside the window ({m['needle_in_window']['length']} tokens)",
            "",
            f"{m['needle_in_window']['trials_per_depth']} trials per depth, held-out code, `KEY_xx = NNNNN` at "
            "the depth, prompt ends `assert KEY_xx ==`, greedy exact match.",
            "",
            head,
            sep,
            "| accuracy | " + " | ".join(f"{a:.0%}" for a in m["needle_in_window"]["accuracy"].values()) + " |",
            "| distance (tokens) | "
            + " | ".join(f"{x:.0f}" for x in m["needle_in_window"]["distance"].values())
            + " |",
            "",
            *multikey_lines(m),
            f"## (3) At {ext['factor']}x the window ({ext['length']} tokens), training-free",
            "",
            "Needle accuracy by depth:",
            "",
            "| method | " + " | ".join(f"{float(d):.0%}" for d in depths) + f" | mean @ {ext['length']} | "
            f"mean @ {m['needle_in_window']['length']} |",
            "|---" * (len(depths) + 3) + "|",
        ]
        first = next(iter(ext["methods"].values()))
        for name, r in ext["methods"].items():
            accs = list(r["needle_accuracy_at_extended"].values())
            small = list(r["needle_accuracy_in_window"].values())
            lines.append(
                f"| {name} | "
                + " | ".join(f"{a:.0%}" for a in accs)
                + f" | {np.mean(accs):.0%} | {np.mean(small):.0%} |"
            )
        lines += [
            "",
            "| distance (tokens) | "
            + " | ".join(f"{x:.0f}" for x in first["needle_distance_at_extended"].values())
            + " | | |",
            "",
            f"Perplexity of the same targets (positions >= {ext['length']} of {first['documents']} held-out files, "
            f"{first['targets']:,} tokens) by context given:",
            "",
            "| method | " + " | ".join(first["ppl_by_context"]) + " | extended/window ratio (95% CI) |",
            "|---" * (len(first["ppl_by_context"]) + 2) + "|",
        ]
        for name, r in ext["methods"].items():
            g = r["extended_vs_window"]
            lines.append(
                f"| {name} | "
                + " | ".join(f"{v:.2f}" for v in r["ppl_by_context"].values())
                + f" | {g['ppl_ratio']:.3f} ({g['ppl_ratio_ci95'][0]:.3f}-{g['ppl_ratio_ci95'][1]:.3f}) |"
            )
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parse(argv: list[str] | None) -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="model folder to write / measure")
    parser.add_argument("--measure-only", action="store_true", help="measure the saved model, do not train")
    parser.add_argument("--init-from", type=Path, default=None, help="continue training this saved model")
    parser.add_argument("--skip-measure", action="store_true", help="train and save only")
    for f in dataclasses.fields(Settings):
        if f.name == "extra":
            continue
        default = f.default
        if isinstance(default, tuple):
            kind = type(default[0])
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, nargs="+", default=None)
        else:
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(default), default=None)
    args = parser.parse_args(argv)
    values = {
        f.name: (tuple(v) if isinstance(v, list) else v)
        for f in dataclasses.fields(Settings)
        if (v := getattr(args, f.name, None)) is not None
    }
    return Settings(**values), args


def main(argv: list[str] | None = None) -> int:
    s, args = parse(argv)
    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    out: Path = args.out
    report_path = out / "grow_report.json"

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    if args.measure_only:
        if not (out / "model.safetensors").is_file():
            print(f"no saved model in {out}; run without --measure-only first", file=sys.stderr)
            return 2
        report = json.loads(report_path.read_text()) if report_path.is_file() else {}
        # The saved recipe is the one that counts for a saved model; measurement knobs come from the flags.
        s = Settings(**{**report.get("settings", {}), **{k: v for k, v in vars(s).items() if k in MEASURE_KEYS}})
    else:
        root, train_files, heldout_files = split_files(s.heldout_mod)
        log(f"split: {len(train_files)} training files, {len(heldout_files)} held out")
        t0 = time.time()
        init = None
        if args.init_from:
            # A second stage: continue training a saved model (same tokenizer) with this run's settings.
            init, tokenizer = load_saved(args.init_from)
            init.train()
        else:
            tokenizer = train_tokenizer(train_files, s.vocab_size)
        train_docs = encode_files(tokenizer, train_files)
        heldout_docs = encode_files(tokenizer, heldout_files)
        log(f"tokenizer: {len(tokenizer)} tokens in {time.time() - t0:.0f} s")
        model, training = pretrain(s, tokenizer, train_docs, heldout_docs, log, model=init)
        previous: dict[str, Any] = {}
        if init is None and s.stage2_steps > 0:
            log("stage 2: more needles, lower lr")
            previous = {"earlier_stages": [{"settings": dataclasses.asdict(s), "training": training}]}
            s2 = dataclasses.replace(
                s,
                seed=s.stage2_seed,
                steps=s.stage2_steps,
                needle_share=s.stage2_needle_share,
                lr=s.stage2_lr,
                warmup=s.stage2_warmup,
                eval_every=min(s.eval_every, s.stage2_steps // 2 or 1),
            )
            model, training = pretrain(s2, tokenizer, train_docs, heldout_docs, log, model=model)
            s = s2  # the report's settings are those of the last stage; earlier ones are listed with it
        if args.init_from and (args.init_from / "grow_report.json").is_file():
            old = json.loads((args.init_from / "grow_report.json").read_text())
            previous = {
                "earlier_stages": [
                    *old.get("earlier_stages", []),
                    {k: old[k] for k in ("train_command", "settings", "training") if k in old},
                ]
            }
        report = {
            **previous,
            "training": training,
            "split": {
                "rule": f"held out when int(sha1(path relative to stdlib root).hexdigest(), 16) % {s.heldout_mod} == 0",
                "stdlib_root": str(root),
                "train_files": len(train_files),
                "heldout_files": len(heldout_files),
            },
        }
        heldout_list = "\n".join(p.relative_to(root).as_posix() for p in heldout_files) + "\n"
        save_model(model, tokenizer, out, {"heldout_files.txt": heldout_list})
        log(f"saved to {out}")
    command = "python benchmarks/grow_base.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if not args.measure_only:
        report["train_command"] = command
    report.update(
        {
            "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(s).items()},
            "command": command,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
            f"{s.threads} threads, Python {platform.python_version()}",
        }
    )
    # Written before measuring too, so that the training record survives an interrupted measurement.
    write_report(report, out)
    if not args.skip_measure:
        report["measurements"] = measure(out, s, log)
        write_report(report, out)
    log(f"report: {report_path} and {out / 'grow_report.md'}")
    return 0


def write_report(report: dict[str, Any], out: Path) -> None:
    (out / "grow_report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "grow_report.md").write_text(markdown(report, out.name) + "\n")


MEASURE_KEYS = {"threads", "needle_trials", "depths", "extend_factor", "methods", "short_context"}
MEASURE_KEYS |= {"max_targets_per_doc", "bootstrap"}

if __name__ == "__main__":
    raise SystemExit(main())
