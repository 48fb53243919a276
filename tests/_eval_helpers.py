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


def loaded(model, tokenizer, name: str = "tiny") -> LoadedModel:
    return LoadedModel(name=name, model=model.eval(), tokenizer=tokenizer, rope=read_rope(model.config), info={})


def tiny_lm(tokenizer, method: str | None = None, target: int = 512, seed: int = 0):
    from tests.conftest import tiny_model

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
