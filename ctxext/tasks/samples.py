"""A cell of retrieval trials: ``trials`` samples of one task at one length and depth, seeded by the cell alone.

Evaluation grids, task export, calibration and the training probe draw their trials here, so the same
``(seed, task, template, length, depth, trial)`` gives the same prompt everywhere and every model of a
comparison sees the same trials in any order.
"""

from __future__ import annotations

import random
from typing import Any

from ctxext.tasks.base import ChatWrap, Haystack, TaskSample, Template
from ctxext.tasks.registry import get_task


def check_depths(values: list[float]) -> list[float]:
    """Needle depths in percent, or a ``ValueError`` naming those outside 0–100 (a settings validator's check)."""
    bad = [d for d in values if not 0 <= d <= 100]
    if bad:
        raise ValueError(f"depths {bad} are outside 0–100 (percent)")
    return values


def make_samples(
    tokenizer: Any,
    task: str,
    haystack: Haystack,
    length: int,
    depth: float,
    *,
    trials: int,
    seed: int,
    template: int | Template | list[int] = 0,
    options: dict[str, int] | None = None,
    chat: ChatWrap | None = None,
) -> list[TaskSample]:
    """The ``trials`` samples of one cell (depth in percent), seeded by the cell alone.

    Only the tokenizer is needed, so exports build a grid's prompts without loading weights. A list of template
    indices is cycled over the trials (trial ``t`` uses ``template[t % n]``); ``chat`` wraps each prompt in a chat
    template.
    """
    t = get_task(task)
    out = []
    for trial in range(trials):
        tpl = template[trial % len(template)] if isinstance(template, list) else template
        tag = tpl if isinstance(tpl, int) else "custom"
        rng = random.Random(f"{seed}-{task}-{tag}-{length}-{depth:g}-{trial}")
        out.append(
            t.generate(tokenizer, haystack, length, depth / 100, rng, template=tpl, chat=chat, **(options or {}))
        )
    return out
