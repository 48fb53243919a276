"""Tiny random models of the RoPE families, built from configs (nothing is downloaded)."""

from __future__ import annotations

import copy

import torch

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
    """A tiny random model of ``kind`` (seeded), in eval mode with SDPA attention."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind, **overrides), attn_implementation="sdpa")
    return model.eval()
