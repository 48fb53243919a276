"""The shapes a grown model can take: one transformers config per architecture, and the checks of a shape.

A grown base of another shape than Llama shows whether what ctxext does (RoPE patching, LoRA training,
scoring) transfers: Qwen2 (grouped-query attention, biases on q/k/v) and GPT-NeoX (only part of each head
rotates, attention and MLP in parallel, fused ``query_key_value``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from ctxext.errors import InputError


class Shape(Protocol):
    """The settings a shape is read from (:class:`~ctxext.models.grown.settings.GrowSettings` has them)."""

    arch: str
    window: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    rotary_pct: float
    rope_theta: float
    tie_embeddings: bool


def _common(s: Shape, tokenizer: Any, **rope: Any) -> dict[str, Any]:
    """The config keys every shape shares: sizes, window, RoPE base, special tokens, the head tied or not."""
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "max_position_embeddings": s.window,
        "rope_parameters": {"rope_theta": s.rope_theta, "rope_type": "default", **rope},
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": s.tie_embeddings,
    }


def _llama(s: Shape, tokenizer: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**_common(s, tokenizer), num_key_value_heads=s.kv_heads or s.heads)


def _qwen2(s: Shape, tokenizer: Any) -> Any:
    from transformers import Qwen2Config

    # Qwen2's attention always has q/k/v biases; no sliding window (the whole window is attended).
    return Qwen2Config(**_common(s, tokenizer), num_key_value_heads=s.kv_heads or s.heads, use_sliding_window=False)


def _mistral(s: Shape, tokenizer: Any) -> Any:
    from transformers import MistralConfig

    # No sliding window: the whole window is attended, as in the other shapes.
    return MistralConfig(**_common(s, tokenizer), num_key_value_heads=s.kv_heads or s.heads, sliding_window=None)


def _gpt_neox(s: Shape, tokenizer: Any) -> Any:
    from transformers import GPTNeoXConfig

    # As Pythia: GELU MLP, parallel residual, biases everywhere, LayerNorm; rotary on a share of each head.
    return GPTNeoXConfig(**_common(s, tokenizer, partial_rotary_factor=s.rotary_pct), use_parallel_residual=True)


class Architecture(NamedTuple):
    """A grown-model architecture: its name in reports and the transformers config of a shape."""

    name: str
    config: Callable[[Shape, Any], Any]


# arch setting -> the architecture.
ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("Llama", _llama),
    "qwen2": Architecture("Qwen2", _qwen2),
    "mistral": Architecture("Mistral", _mistral),
    "gpt_neox": Architecture("GPT-NeoX", _gpt_neox),
}


def check_shape(s: Shape) -> None:
    """Refuse a shape no architecture can build, naming the setting (``--flag``) and the fix.

    Raises:
        InputError: unknown ``arch``, ``kv_heads`` that do not divide ``heads`` (or differ from them for
            ``gpt_neox``), ``rotary_pct`` outside (0, 1] (or below 1 for any other), or a
            ``hidden`` size that ``heads`` do not divide.
    """
    if s.arch not in ARCHITECTURES:
        names = ", ".join(ARCHITECTURES)
        raise InputError(f"arch (--arch) {s.arch!r}: not a grown-model architecture; use one of {names}")
    if s.heads <= 0 or s.hidden % s.heads:
        raise InputError(f"heads (--heads) {s.heads}: must divide hidden (--hidden) {s.hidden}")
    kv = s.kv_heads or s.heads
    if kv < 0 or kv > s.heads or s.heads % kv:
        raise InputError(f"kv_heads (--kv-heads) {s.kv_heads}: must divide heads (--heads) {s.heads} (0: as many)")
    if s.arch == "gpt_neox" and kv != s.heads:
        raise InputError(
            f"kv_heads (--kv-heads) {s.kv_heads}: gpt_neox has one key/value head per head (no grouped-query "
            f"attention); use 0 or {s.heads}, or --arch qwen2 / mistral / llama for GQA"
        )
    if not 0 < s.rotary_pct <= 1:
        raise InputError(f"rotary_pct (--rotary-pct) {s.rotary_pct}: must be in (0, 1]")
    if s.rotary_pct < 1 and s.arch != "gpt_neox":
        raise InputError(
            f"rotary_pct (--rotary-pct) {s.rotary_pct}: only gpt_neox rotates part of each head; use 1.0 for "
            f"{s.arch}, or --arch gpt_neox"
        )
    rotary = int(s.hidden // s.heads * s.rotary_pct)
    if rotary < 2 or rotary % 2:
        raise InputError(
            f"rotary_pct (--rotary-pct) {s.rotary_pct}: rotates {rotary} of each head's {s.hidden // s.heads} "
            "dimensions; RoPE needs an even number, at least 2"
        )
