"""Helpers for the evaluator tests: in-memory tiny models wrapped as LoadedModel, and an independent ppl."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ctxext.models.builtin import stdlib_files
from ctxext.models.load import LoadedModel
from ctxext.rope.read import read_rope
from ctxext.rope.runtime import patch_model


def stdlib_texts(n: int, min_chars: int = 4000) -> list[str]:
    texts = []
    for path in stdlib_files(min_bytes=min_chars):
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
        if len(texts) >= n:
            break
    return texts


# ChatML (SmolLM2, Qwen): each message in <|im_start|>ROLE … <|im_end|>, the generation prompt an assistant header.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml_tokenizer(tokenizer, instruct: bool = True):
    """A copy of a tiny tokenizer with ChatML's two special tokens and template.

    ``instruct``: its end of sequence is ``<|im_end|>``, the template's end of turn, as an instruct checkpoint's
    (SmolLM2-135M-Instruct); otherwise it stays ``</s>``, as a base checkpoint that ships a template.
    """
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tok.chat_template = CHATML
    if instruct:
        tok.eos_token = "<|im_end|>"
    return tok


# SmolLM2's head shape (9 query / 3 key-value heads) at a tiny size.
GQA = dict(hidden_size=72, intermediate_size=96, num_attention_heads=9, num_key_value_heads=3, head_dim=8)


def save_tiny_model(tokenizer, out, **config):
    """A saved tiny Llama (context 256) for ``tokenizer``, its special-token ids in the config, as a model folder.

    ``config`` overrides config fields (e.g. ``tie_word_embeddings=True, **GQA``).
    """
    from tests.helpers.tiny import tiny_model

    ids = {k: getattr(tokenizer, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    tiny_model("llama", vocab_size=len(tokenizer), **ids, **config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def loaded(model, tokenizer, name: str = "tiny") -> LoadedModel:
    return LoadedModel(name=name, model=model.eval(), tokenizer=tokenizer, rope=read_rope(model.config), info={})


def tiny_lm(tokenizer, method: str | None = None, target: int = 512, seed: int = 0):
    from tests.helpers.tiny import tiny_model

    model = tiny_model("llama", seed=seed, vocab_size=len(tokenizer))
    if method:
        patch_model(model, method, target)
    return model


@torch.no_grad()
def reference_ppl(model, docs: list[list[int]], length: int) -> tuple[float, int]:
    """Plain full-logits cross-entropy over documents truncated to ``length`` (≥ length tokens only)."""
    total, count = 0.0, 0
    for ids in docs:
        if len(ids) < length:
            continue
        x = torch.tensor(ids[:length])[None]
        logits = model(x).logits.float()
        loss = F.cross_entropy(logits[0, :-1], x[0, 1:], reduction="sum")
        total += float(loss)
        count += length - 1
    return math.exp(total / count), count


@torch.no_grad()
def reference_bucket(model, docs: list[list[int]], length: int, start: int, end: int) -> float:
    total, count = 0.0, 0
    for ids in docs:
        if len(ids) < length:
            continue
        x = torch.tensor(ids[:length])[None]
        nll = F.cross_entropy(model(x).logits.float()[0, :-1], x[0, 1:], reduction="none")
        lo = max(start, 1)
        total += float(nll[lo - 1 : end - 1].sum())
        count += end - lo
    return math.exp(total / count)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run ~80× faster single-threaded on a busy 2-core machine (OpenMP threads spin-wait)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
