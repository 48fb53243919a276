"""Attention diagnostics: where each layer's attention mass goes, by distance, on real documents.

The positional-encoding literature explains a method's failure with this picture: past the original
window an unscaled model spreads or misplaces its attention; a good extension keeps attending far back
without losing the local pattern. For a few documents cut to ``length`` tokens, per layer (averaged over
heads):

* **mass by distance band**: the share of each query's attention on keys at distance ``d = i − j`` in
  bands relative to the length (``[0, 1 %)``, ``[1 %, 10 %)``, ``[10 %, 50 %)``, ``[50 %, 100 %]`` by
  default), and on keys **beyond the original window** (``d ≥`` the model's original context);
* **sinks**: the mass on the first ``sink_tokens`` tokens of the sequence;
  (these three average over the queries in the second half of the sequence, each of which can look
  back at least half the length, so every band and the far keys are within its reach);
* **entropy** of the attention distribution (nats) by query position bucket, over all queries.

SDPA never materialises the attention matrix, so the probabilities are recomputed from the layer's own
inputs: a forward pre-hook on each attention module takes the hidden states and the ``(cos, sin)`` the
model passes it, projects q and k with the module's weights, applies the rotary embedding with the
``apply_rotary_pos_emb`` of the model's own modeling module (so YaRN's attention scaling, carried in
cos / sin, is included exactly), and takes ``softmax(q·kᵀ · scaling)`` with the causal mask, ``query
block`` rows at a time (memory stays bounded at any length). A test checks the result against eager
attention's ``output_attentions``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ctxext.errors import InputError
from ctxext.evaluation.sections.attention.settings import AttentionTask
from ctxext.models.load import LoadedModel, base_model
from ctxext.progress import progress
from ctxext.rope.runtime import reset_dynamic_rope

# Elements of one block of attention scores (heads × query rows × keys): 16M floats = 64 MB.
BLOCK_ELEMENTS = 1 << 24


@dataclass
class AttentionSettings:
    """An attention-diagnostics run.

    Attributes:
        length: tokens per document (default: the model's context).
        docs: documents (each must reach ``length`` tokens).
        bands: upper edges of the distance bands as fractions of the length (the last band ends at 1).
        sink_tokens: how many first tokens count as attention sinks.
        position_buckets: query-position buckets for the entropy profile.
        allow_beyond_context: accept a length above the model's context (to see how an unextended model
            attends past its window).
    """

    # The defaults are the declared ones (:mod:`.settings`, AttentionTask: the suite section): one each.
    length: int | None = None
    docs: int = field(default_factory=lambda: _declared("docs"))
    bands: list[float] = field(default_factory=lambda: _declared("bands"))
    sink_tokens: int = field(default_factory=lambda: _declared("sink_tokens"))
    position_buckets: int = 8
    allow_beyond_context: bool = False

    @classmethod
    def of_section(cls, section: AttentionTask, length: int | None, allow_beyond: bool) -> AttentionSettings:
        """The run of a suite's (or ``ctxext eval attention``'s) settings at a length in tokens (None: the context)."""
        return cls(
            length=length,
            docs=section.docs,
            bands=list(section.bands),
            sink_tokens=section.sink_tokens,
            allow_beyond_context=allow_beyond,
        )

    def validate(self) -> None:
        """Raise :class:`InputError` for settings that cannot give sensible numbers."""
        if self.docs < 1:
            raise InputError(f"attention docs must be at least 1 (got {self.docs})")
        if self.length is not None and self.length < 8:
            raise InputError(f"attention length must be at least 8 tokens (got {self.length})")
        if sorted(self.bands) != list(self.bands) or any(not 0 < b < 1 for b in self.bands):
            raise InputError(f"attention bands {self.bands}: increasing fractions strictly between 0 and 1")
        if self.sink_tokens < 1 or self.position_buckets < 1:
            raise InputError("sink tokens and position buckets must be at least 1")


def _declared(name: str) -> Any:
    return AttentionTask.model_fields[name].get_default(call_default_factory=True)


def band_labels(bands: list[float]) -> list[str]:
    """``["0–1%", "1–10%", …, "50–100%"]`` for band edges ``[0.01, 0.1, 0.5]``."""
    edges = [0.0, *bands, 1.0]
    return [f"{a * 100:g}–{b * 100:g}%" for a, b in zip(edges[:-1], edges[1:], strict=True)]


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention module of every decoder layer (Llama-family layout: ``layers[i].self_attn``).

    Raises:
        InputError: the model has no such layout.
    """
    decoder = base_model(model).get_decoder()
    layers = getattr(decoder, "layers", None)
    mods = [getattr(layer, "self_attn", None) for layer in layers or []]
    if not mods or any(m is None or not hasattr(m, "q_proj") or not hasattr(m, "k_proj") for m in mods):
        raise InputError(
            f"{type(base_model(model)).__name__}: attention diagnostics need decoder layers with self_attn.q_proj / "
            "k_proj (Llama-family models)"
        )
    return [m for m in mods if m is not None]  # all of them (checked above)


def _rotary(module: torch.nn.Module) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    # The model's own implementation, so the diagnostics rotate exactly as its attention does.
    fn = getattr(sys.modules[type(module).__module__], "apply_rotary_pos_emb", None)
    if fn is None:
        raise InputError(f"{type(module).__module__} has no apply_rotary_pos_emb: not a RoPE attention module")
    return fn


def rotated_qk(
    module: torch.nn.Module, hidden: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotated queries and keys an attention module computes, keys repeated to one per query head.

    Args:
        module: an attention module (``q_proj``, ``k_proj``, ``head_dim``, optional ``q_norm`` / ``k_norm``).
        hidden: its input hidden states ``[batch, T, hidden]``.
        position_embeddings: the ``(cos, sin)`` the model passes to it.

    Returns:
        ``(q, k)``, each ``[batch, heads, T, head_dim]`` in float32.
    """
    # Used duck-typed: transformers' attention classes share no base that declares these attributes, and
    # nn.Module types every attribute as Tensor | Module.
    attn: Any = module
    shape = (*hidden.shape[:-1], -1, attn.head_dim)
    q = attn.q_proj(hidden).view(shape)
    k = attn.k_proj(hidden).view(shape)
    if hasattr(attn, "q_norm"):  # Qwen3-style per-head norms come before the rotation
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = position_embeddings
    q, k = _rotary(module)(q, k, cos, sin)
    groups = q.shape[1] // k.shape[1]
    return q.float(), k.float().repeat_interleave(groups, dim=1)


def attention_probs(q: torch.Tensor, k: torch.Tensor, scaling: float, start: int, end: int) -> torch.Tensor:
    """Causal softmax attention of query rows ``[start, end)`` over keys ``[0, end)``.

    Args:
        q: ``[heads, T, d]`` rotated queries (one sequence).
        k: ``[heads, T, d]`` rotated keys.
        scaling: the module's score scaling (``head_dim ** -0.5``).
        start: first query row.
        end: one past the last query row.

    Returns:
        ``[heads, end − start, end]`` probabilities (zero above the diagonal).
    """
    scores = torch.matmul(q[:, start:end], k[:, :end].transpose(-1, -2)) * scaling
    rows = torch.arange(start, end)[:, None]
    cols = torch.arange(end)[None, :]
    scores = scores.masked_fill(cols > rows, float("-inf"))
    return torch.softmax(scores, dim=-1)


class _Accumulator:
    """Running sums of one model's statistics, per layer."""

    def __init__(self, layers: int, length: int, original: int, settings: AttentionSettings) -> None:
        self.T, self.original, self.s = length, original, settings
        n_bands = len(settings.bands) + 1
        self.band = torch.zeros(layers, n_bands, dtype=torch.float64)
        self.beyond = torch.zeros(layers, dtype=torch.float64)
        self.sinks = torch.zeros(layers, dtype=torch.float64)
        self.far_queries = torch.zeros(layers, dtype=torch.float64)  # heads × second-half queries
        self.entropy = torch.zeros(layers, settings.position_buckets, dtype=torch.float64)
        self.ent_count = torch.zeros(layers, settings.position_buckets, dtype=torch.float64)
        edges = torch.tensor([0.0, *settings.bands, math.inf]) * length
        self.edges = edges
        # Per document (for paired comparisons between models): beyond-window mass and query count per layer.
        self.doc = 0
        self.doc_beyond: list[torch.Tensor] = []
        self.doc_far: list[torch.Tensor] = []

    def start_document(self) -> None:
        self.doc = len(self.doc_beyond)
        self.doc_beyond.append(torch.zeros(len(self.band), dtype=torch.float64))
        self.doc_far.append(torch.zeros(len(self.band), dtype=torch.float64))

    def add(self, layer: int, p: torch.Tensor, start: int) -> None:
        heads, rows, keys = p.shape
        qpos = torch.arange(start, start + rows)
        dist = qpos[:, None] - torch.arange(keys)[None, :]  # negative above the diagonal, where p = 0
        ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)  # [heads, rows]
        bucket = (qpos * self.s.position_buckets // self.T).clamp_max(self.s.position_buckets - 1)
        self.entropy[layer].index_add_(0, bucket, ent.sum(0).double())
        self.ent_count[layer].index_add_(0, bucket, torch.full((rows,), float(heads), dtype=torch.float64))
        far = qpos >= self.T // 2
        if not far.any():
            return
        pf, df = p[:, far], dist[far]
        self.far_queries[layer] += heads * int(far.sum())
        for b in range(len(self.edges) - 1):
            inside = (df >= self.edges[b]) & (df < self.edges[b + 1])
            self.band[layer, b] += float((pf * inside).sum())
        beyond = float((pf * (df >= self.original)).sum())
        self.beyond[layer] += beyond
        self.doc_beyond[self.doc][layer] += beyond
        self.doc_far[self.doc][layer] += heads * int(far.sum())
        self.sinks[layer] += float(pf[..., : self.s.sink_tokens].sum())

    def result(self) -> list[dict[str, Any]]:
        n = self.far_queries.clamp_min(1)
        ent = self.entropy / self.ent_count.clamp_min(1)
        return [
            {
                "layer": i,
                "bands": (self.band[i] / n[i]).tolist(),
                "beyond_original": float(self.beyond[i] / n[i]),
                "sinks": float(self.sinks[i] / n[i]),
                "entropy_by_position": ent[i].tolist(),
                "entropy": float(self.entropy[i].sum() / self.ent_count[i].sum().clamp_min(1)),
            }
            for i in range(len(self.band))
        ]


def _hook_for(acc: _Accumulator, layer: int, length: int) -> Callable[..., None]:
    # A forward pre-hook on one attention module: its rotated q and k give the attention probabilities,
    # computed in query blocks so that no full T x T matrix of every head is held at once.
    def hook(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        pos = kwargs.get("position_embeddings") or (args[1] if len(args) > 1 else None)
        if pos is None:
            raise InputError(
                f"{type(module).__name__} is not passed position_embeddings (cos, sin); attention diagnostics "
                "need a model that computes its rotary embedding once per forward (transformers >= 4.48 layout)"
            )
        q, k = rotated_qk(module, hidden, pos)
        heads = q.shape[1]
        block = max(1, BLOCK_ELEMENTS // (heads * length))
        for start in range(0, length, block):
            end = min(start + block, length)
            # A float attribute, which nn.Module types as Tensor | Module.
            scaling = float(module.scaling)  # type: ignore[arg-type]
            acc.add(layer, attention_probs(q[0], k[0], scaling, start, end).cpu(), start)

    return hook


def evaluate_attention(
    loaded: LoadedModel, texts: Any, settings: AttentionSettings, show_progress: bool = True
) -> dict[str, Any]:
    """Attention mass by distance band, on sinks and beyond the original window, and entropy by position.

    Args:
        loaded: the model.
        texts: document texts (the first ``settings.docs`` reaching the length are used).
        settings: length, documents, bands.
        show_progress: draw a progress bar.

    Returns:
        The ``attention`` section of a report.

    Raises:
        InputError: bad settings, a length beyond the model's context, too few long documents, or a model
            without Llama-style attention modules.
    """
    from ctxext.scoring.documents import document_key, tokenize_documents, too_short_error

    settings.validate()
    started = time.perf_counter()
    length = settings.length or loaded.context_length
    if length > loaded.context_length and not settings.allow_beyond_context:
        raise InputError(
            f"{loaded.name} addresses {loaded.context_length} tokens; attention length {length} is beyond it. Use "
            "a shorter --length, or --allow-beyond-context to see how it attends past its window."
        )
    docs = tokenize_documents(texts, loaded.tokenizer, length, settings.docs, length)
    if len(docs.ids) < settings.docs:
        raise too_short_error(docs, length, "the attention length", settings.docs)
    modules = attention_modules(loaded.model)
    acc = _Accumulator(len(modules), length, loaded.original_length, settings)
    device = next(loaded.model.parameters()).device

    handles = [m.register_forward_pre_hook(_hook_for(acc, i, length), with_kwargs=True) for i, m in enumerate(modules)]
    decoder = base_model(loaded.model).get_decoder()
    try:
        with progress(f"attention {loaded.name}", len(docs.ids), enabled=show_progress) as advance:
            for ids in docs.ids:
                acc.start_document()
                reset_dynamic_rope(loaded.model)
                # No graph: the forward only feeds the hooks (a decorator on the hook factory did not cover it,
                # so every layer's activations were kept for a backward pass that never comes).
                with torch.inference_mode():
                    decoder(input_ids=ids[None, :length].to(device), use_cache=False)
                advance(1)
    finally:
        for h in handles:
            h.remove()
        reset_dynamic_rope(loaded.model)
    layers = acc.result()
    n_bands = len(settings.bands) + 1
    return {
        "length": length,
        "documents": len(docs.ids),
        "original_length": loaded.original_length,
        "beyond_context": length > loaded.context_length,
        "band_labels": band_labels(settings.bands),
        "queries": "second half of the sequence (positions >= length / 2) for bands, sinks and beyond-window mass",
        "layers": layers,
        "mean": {
            "bands": [sum(lay["bands"][b] for lay in layers) / len(layers) for b in range(n_bands)],
            "beyond_original": sum(lay["beyond_original"] for lay in layers) / len(layers),
            "sinks": sum(lay["sinks"] for lay in layers) / len(layers),
            "entropy": sum(lay["entropy"] for lay in layers) / len(layers),
        },
        "per_document": {
            "keys": [document_key(d[:length]) for d in docs.ids],
            # Mean over layers of each document's share of attention beyond the original window.
            "beyond_original": [
                float((b / f.clamp_min(1)).mean()) for b, f in zip(acc.doc_beyond, acc.doc_far, strict=True)
            ],
        },
        "position_buckets": [
            [b * length // settings.position_buckets, (b + 1) * length // settings.position_buckets]
            for b in range(settings.position_buckets)
        ],
        "settings": asdict(settings),
        "seconds": round(time.perf_counter() - started, 3),
    }
