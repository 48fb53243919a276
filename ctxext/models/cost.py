"""What a forward pass costs at a length, estimated from one short forward measured on the model itself.

Long checks (merge's logits at the target, calibration's trials) say up front how long they will take. The
estimate scales one measured short forward by the FLOPs of a causal forward, ``2·N·T`` for the projections plus
``2·layers·heads·head_dim·T²`` for causal attention (QKᵀ and AV over half the T×T scores), plus the output head
at the positions whose logits are kept. On SmolLM2-135M (fp32, SDPA, 2 CPU cores) scaling a 2,048-token
forward this way predicts 8k / 16k / 32k within 5 % of the measured 31 / 97–103 / 351 s; other work on the
cores slows every forward alike.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch


def _shape(config: Any) -> tuple[int, int, int, int, int, int, int]:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    kv = int(getattr(text, "num_key_value_heads", None) or heads)
    inter = int(getattr(text, "intermediate_size", None) or 4 * text.hidden_size)
    return int(text.num_hidden_layers), int(text.hidden_size), heads, kv, head_dim, inter, int(text.vocab_size)


def forward_flops(config: Any, length: int, logits: int = 1) -> float:
    """FLOPs of one causal forward over ``length`` tokens, the output head at ``logits`` positions.

    Args:
        config: the model's config.
        length: tokens in the sequence.
        logits: positions projected onto the vocabulary.
    """
    layers, hidden, heads, kv, head_dim, inter, vocab = _shape(config)
    q = heads * head_dim
    # q, k, v and o projections plus a gated MLP; 2 FLOPs per weight and token.
    per_token = 2 * layers * (2 * hidden * q + 2 * hidden * kv * head_dim + 3 * hidden * inter)
    attention = 2 * layers * q * length  # per token: causal QKᵀ and AV
    return float(length * (per_token + attention) + 2 * hidden * vocab * logits)


@dataclass
class ForwardClock:
    """One short forward measured on a model, scaled to other lengths by :func:`forward_flops`.

    Attributes:
        config: the model's config.
        length: tokens of the measured forward.
        seconds: its wall time.
    """

    config: Any
    length: int
    seconds: float

    @classmethod
    @torch.no_grad()
    def measure(cls, model: Any, length: int = 256, repeats: int = 3) -> ForwardClock:
        """The fastest of ``repeats`` forwards over ``length`` random tokens (last position's logits only) on ``model``.

        One timing on shared cores is noisy: in a demo run right after its fine-tune, on cores other jobs held, the
        calibration estimate from one timed forward said 1h32m for what then took 79 s (from the fastest of 3: 1m04s).
        The fastest of a few is what the model costs when it gets the cores; the estimate's rounding covers the rest.

        Args:
            model: a causal LM (a peft wrapper too), in eval mode.
            length: tokens; short, so the measurement costs little next to what it estimates.
            repeats: timed forwards.
        """
        from ctxext.rope.runtime import reset_dynamic_rope

        embeddings = model.get_input_embeddings()
        device = embeddings.weight.device
        ids = torch.randint(0, int(embeddings.weight.shape[0]), (1, length), generator=torch.Generator().manual_seed(0))
        # The first forward of a freshly loaded model also pages its weights in (40 s instead of 2 s for SmolLM2 on
        # busy cores): a few tokens first, so that the timed forward is what every later one costs.
        model(input_ids=ids[:, :8].to(device), logits_to_keep=1, use_cache=False)
        seconds = math.inf
        for _ in range(max(1, repeats)):
            reset_dynamic_rope(model)
            start = time.perf_counter()
            model(input_ids=ids.to(device), logits_to_keep=1, use_cache=False)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = min(seconds, time.perf_counter() - start)
        reset_dynamic_rope(model)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        return cls(base.config, length, seconds)

    def seconds_at(self, length: int, logits: int = 1) -> float:
        """The estimated wall time of one forward over ``length`` tokens with ``logits`` projected positions."""
        return self.seconds * forward_flops(self.config, length, logits) / forward_flops(self.config, self.length)

    def note(self) -> str:
        """What the estimate rests on, for messages."""
        return f"a {self.length:,}-token forward took {self.seconds:.2g} s here"
