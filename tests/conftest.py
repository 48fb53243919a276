"""Shared fixtures: tiny random models built from configs, and a locally trained tokenizer.

Nothing is downloaded: tests run with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One thread: on two shared cores a tiny model runs ~100x faster single-threaded than contended.
torch.set_num_threads(1)

TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


def tiny_config(kind: str = "llama", **overrides):
    """A tiny config of a RoPE model family: llama, mistral or qwen2."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    classes = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}
    kwargs = copy.deepcopy(TINY)
    kwargs.update(overrides)
    return classes[kind](**kwargs)


def tiny_model(kind: str = "llama", seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind, **overrides), attn_implementation="sdpa")
    return model.eval()


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    """One ctxext cache for the whole test session (built-in models are built once)."""
    root = tmp_path_factory.mktemp("ctxext-cache")
    os.environ["CTXEXT_CACHE"] = str(root)
    return root


@pytest.fixture(scope="session")
def tiny_tokenizer(cache_root):
    from ctxext.models.builtin import train_code_tokenizer

    return train_code_tokenizer(vocab_size=512, max_bytes=200_000)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A saved tiny Llama (context 256) with a tokenizer, as a model folder."""
    out = tmp_path_factory.mktemp("tiny-llama")
    model = tiny_model(
        "llama",
        bos_token_id=tiny_tokenizer.bos_token_id,
        eos_token_id=tiny_tokenizer.eos_token_id,
        pad_token_id=tiny_tokenizer.pad_token_id,
    )
    model.save_pretrained(out)
    tiny_tokenizer.save_pretrained(out)
    return out


def pytest_collection_modifyitems(config, items):
    """Tests measured slower than the quick tier's limit (``tests/durations.json``) are ``slow`` as well."""
    from _durations import slow_tests

    measured = slow_tests()
    for item in items:
        if item.nodeid in measured:
            item.add_marker(pytest.mark.slow)
