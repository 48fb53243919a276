"""Shared fixtures: tiny random models built from configs, and a locally trained tokenizer.

Nothing is downloaded: tests run with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One thread: on two shared cores a tiny model runs ~100x faster single-threaded than contended.
torch.set_num_threads(1)

from tests.helpers.tiny import tiny_model  # noqa: E402 — after the environment above


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
    """``slow`` as well: every test under ``tests/integration/`` (whole journeys through the command line), and
    the tests measured slower than the quick tier's limit (``tests/durations.json``)."""
    from tests.helpers.durations import slow_tests

    measured = slow_tests()
    for item in items:
        if item.nodeid in measured or item.nodeid.startswith("tests/integration/"):
            item.add_marker(pytest.mark.slow)
