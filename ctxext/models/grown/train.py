"""Build, pretrain, save and reload a grown model (fp32 Llama, Qwen2 or GPT-NeoX, AdamW, warm-up then cosine)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctxext.atomic import atomic_folder
from ctxext.models.grown.arch import ARCHITECTURES
from ctxext.models.grown.data import Needles, TrainingSequences, encode
from ctxext.models.grown.settings import GrowSettings

Log = Callable[[str], None]
# The kind recorded in a grown folder's manifest: a rerun replaces only a folder of this kind.
GROWN_KIND = "grown-model"


def build_model(s: GrowSettings, tokenizer: Any) -> Any:
    """A new random model of the settings' architecture and shape, seeded with ``s.seed``.

    Args:
        s: the shape (``arch``, ``layers``, ``hidden``, ``heads``, ``kv_heads``, ``rotary_pct``, ``window``,
            ``rope_theta`` …).
        tokenizer: its tokenizer (vocabulary size and special tokens).

    Returns:
        A causal LM (``LlamaForCausalLM``, ``Qwen2ForCausalLM`` or ``GPTNeoXForCausalLM``) with SDPA
        attention, fp32.
    """
    from transformers import AutoModelForCausalLM

    config = ARCHITECTURES[s.arch].config(s, tokenizer)
    torch.manual_seed(s.seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def training_loss(model: Any, batch: torch.Tensor, answers: torch.Tensor, answer_weight: float) -> torch.Tensor:
    """The LM loss of every token, plus ``answer_weight`` × the mean NLL of the multi-key answer tokens.

    Args:
        model: the causal LM.
        batch: ``[rows, window]`` token ids.
        answers: the same shape, True at the multi-key answer tokens.
        answer_weight: the extra loss's weight (0: the LM loss alone).

    Returns:
        The scalar loss.
    """
    if answer_weight <= 0 or not bool(answers.any()):
        return model(input_ids=batch, labels=batch).loss
    logits = model(input_ids=batch).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
    # Token t is predicted at position t - 1: the answer mask shifts with the targets.
    return nll.mean() + answer_weight * nll[answers[:, 1:]].mean()


def lr_at(step: int, s: GrowSettings) -> float:
    """The learning rate of ``step`` (0-based): linear warm-up, then cosine to ``min_lr_ratio`` × lr."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def heldout_loss(model: Any, windows: torch.Tensor) -> float:
    """Mean LM loss over ``windows`` (64 at a time); leaves the model in training mode."""
    model.eval()
    losses = [model(input_ids=chunk, labels=chunk).loss.item() for chunk in windows.split(64)]
    model.train()
    return float(np.mean(losses))


def _optimizer(model: Any, s: GrowSettings) -> torch.optim.Optimizer:
    # Weight decay on matrices only: norms and biases are not decayed.
    decay = [p for _, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=s.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def _log_line(entry: dict[str, Any], s: GrowSettings, elapsed: float) -> str:
    done = entry["step"]
    eta = elapsed / done * (s.steps - done)
    line = (
        f"step {done}/{s.steps} loss {entry['train_loss']:.3f} lr {entry['lr']:.2e} "
        f"{entry['tokens'] / elapsed:,.0f} tok/s elapsed {elapsed / 60:.1f} min eta {eta / 60:.1f} min"
    )
    if "heldout_loss_plain" in entry:
        line += f" | held-out loss plain {entry['heldout_loss_plain']:.3f}"
        line += f" needle-seqs {entry['heldout_loss_needle_seqs']:.3f}"
    return line


def pretrain(
    s: GrowSettings,
    tokenizer: Any,
    train_docs: list[np.ndarray],
    heldout_docs: list[np.ndarray],
    log: Log,
    model: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """Pretrain a new model (or continue ``model``) on windows of the training files.

    Args:
        s: the recipe of this stage.
        tokenizer: the tokenizer that encoded the documents.
        train_docs: token ids of the training files.
        heldout_docs: token ids of the held-out files (a fixed set of their windows is watched).
        log: receives one line per ``log_every`` steps.
        model: a model to continue training (default: a new one).

    Returns:
        The model (in eval mode) and the training record (parameters, tokens, seconds, loss history).
    """
    sep = np.asarray(encode(tokenizer, "\n\n"), dtype=np.int64)
    stream = np.concatenate([x for doc in train_docs for x in (doc, sep)])
    needles = Needles(tokenizer, s.key_names)
    data = TrainingSequences(stream, needles, s, seed=s.seed + 1)
    # A fixed held-out set of plain code windows and needle windows, to watch the run.
    watch = TrainingSequences(np.concatenate([x for doc in heldout_docs for x in (doc, sep)]), needles, s, s.seed + 2)
    watch_plain = torch.from_numpy(np.stack([watch.code(s.window) for _ in range(256)]))
    watch_needle = torch.from_numpy(np.stack([watch.needle_sequence() for _ in range(256)]))

    model = model if model is not None else build_model(s, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f}M parameters; training stream {len(stream):,} tokens")
    opt = _optimizer(model, s)
    model.train()
    history: list[dict[str, Any]] = []
    t0 = time.time()
    window_loss: list[float] = []
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
            entry: dict[str, Any] = {
                "step": done,
                "train_loss": float(np.mean(window_loss)),
                "lr": lr_at(step, s),
                "elapsed_s": round(elapsed, 1),
                "tokens": done * s.batch * s.window,
            }
            window_loss = []
            if done % s.eval_every == 0 or done == s.steps:
                entry["heldout_loss_plain"] = heldout_loss(model, watch_plain)
                entry["heldout_loss_needle_seqs"] = heldout_loss(model, watch_needle)
            history.append(entry)
            log(_log_line(entry, s, elapsed))
    record = {
        "parameters": n_params,
        "train_stream_tokens": int(len(stream)),
        "tokens_seen": s.steps * s.batch * s.window,
        "seconds": round(time.time() - t0, 1),
        "history": history,
    }
    model.eval()
    return model, record


def save_model(model: Any, tokenizer: Any, out: Path, extra_files: dict[str, str]) -> None:
    """Write model + tokenizer (fp32 safetensors) and ``extra_files`` to ``out``, whole or not at all.

    A folder this builder wrote before (its manifest says ``grown-model``) is replaced; any other
    non-empty folder is left alone.

    Args:
        model: the model.
        tokenizer: its tokenizer.
        out: the folder.
        extra_files: ``{file name: text}`` written beside them.

    Raises:
        InputError: ``out`` holds something this builder did not write.
    """
    with atomic_folder(out, kind=GROWN_KIND, overwrite=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for name, text in extra_files.items():
            (tmp / name).write_text(text)
        # mkdtemp makes a private folder; package data must be readable by everyone.
        tmp.chmod(0o755)
        for child in tmp.iterdir():
            child.chmod(0o644)


def as_loaded(s: GrowSettings, tokenizer: Any) -> Any:
    """The tokenizer as ``AutoTokenizer`` will read it back from a saved model folder of this shape.

    transformers picks the tokenizer class from the folder's ``config.json``; for some architectures that class
    rebuilds the pipeline instead of reading ``tokenizer.json`` (``Qwen2Tokenizer`` splits text and digits with
    Qwen2's own pattern: 11 % more tokens on the stdlib). A model trained with the tokenizer as trained would
    then be read, by every user and by its own measurements, with other ids (0 % retrieval). So the model
    trains with the tokenizer as it will be loaded; for Llama and GPT-NeoX that is the same tokenizer.
    """
    import tempfile

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        ARCHITECTURES[s.arch].config(s, tokenizer).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return AutoTokenizer.from_pretrained(tmp)


def load_saved(path: Path) -> tuple[Any, Any]:
    """A saved grown model (fp32, SDPA, eval mode) and its tokenizer."""
    from transformers import AutoTokenizer

    from ctxext.models.build import load_weights
    from ctxext.models.sources import config_from_folder

    tokenizer = AutoTokenizer.from_pretrained(path)
    return load_weights(path, config_from_folder(path)).eval(), tokenizer
