"""The grown model's recipe: every knob of tokenizer, model, training mixture and optimisation."""

from __future__ import annotations

from dataclasses import dataclass

from ctxext.models.grown.arch import check_shape


@dataclass
class GrowSettings:
    """How a grown model is built and pretrained (``benchmarks/grow_base.py`` makes each a ``--flag``).

    Attributes:
        seed: seeds the model's initialisation and the training windows.
        threads: torch threads.
        vocab_size: byte-level BPE vocabulary, special tokens included.
        heldout_mod: a file is held out when ``sha1(path relative to the stdlib root) % heldout_mod == 0``.
        window: the model's context (``max_position_embeddings``) and the training window.
        hidden: hidden size.
        intermediate: MLP size.
        layers: decoder layers.
        arch: the architecture: ``llama``, ``qwen2`` (GQA, q/k/v biases), ``mistral`` (GQA, no biases) or
            ``gpt_neox`` (partial rotary, parallel residual, fused ``query_key_value``).
        heads: attention heads.
        kv_heads: key/value heads (0: as many as ``heads``); fewer than ``heads`` is grouped-query attention
            (``llama``, ``qwen2``, ``mistral``; ``gpt_neox`` has one key/value head per head).
        rotary_pct: share of each head's dimensions that rotate (below 1 only for ``gpt_neox``).
        rope_theta: RoPE base.
        tie_embeddings: the output head is the input embedding matrix (``tie_word_embeddings``, as SmolLM2 and
            Qwen2-0.5B): one matrix learns both roles.
        needle_share: share of windows with one key/value needle and its query.
        repeat_share: share of windows that repeat a span of themselves.
        multikey_share: share of windows with several needles of distinct names, asking for one.
        max_distractors: a multi-key window holds 2 to ``1 + max_distractors`` needles.
        answer_weight: weight of the extra loss on the multi-key windows' answer tokens (0: none).
        key_names: ``letters`` (``KEY_ab``) or ``words`` (``KEY_path``, one token after ``KEY_``).
        repeat_min: shortest repeated span (tokens).
        repeat_max: longest repeated span (tokens).
        steps: optimizer steps.
        batch: windows per step.
        lr: peak learning rate (linear warm-up, then cosine to ``min_lr_ratio`` × lr).
        min_lr_ratio: the cosine schedule's floor, as a share of ``lr``.
        warmup: warm-up steps.
        weight_decay: AdamW weight decay of the matrices.
        grad_clip: gradient norm clip.
        log_every: steps between log lines.
        eval_every: steps between held-out losses.
        stage2_steps: steps of the second stage of a new model (0: none).
        stage2_needle_share: the second stage's needle share.
        stage2_lr: the second stage's learning rate.
        stage2_warmup: the second stage's warm-up steps.
        stage2_seed: the second stage's seed.
    """

    seed: int = 0
    threads: int = 2
    # Tokenizer and split.
    vocab_size: int = 2048
    heldout_mod: int = 10
    # Model.
    window: int = 64
    hidden: int = 256
    intermediate: int = 688
    layers: int = 4
    arch: str = "llama"
    heads: int = 4
    kv_heads: int = 0
    rotary_pct: float = 1.0
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
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

    def __post_init__(self) -> None:
        # A shape no architecture can build is refused here, before a tokenizer is trained.
        check_shape(self)
