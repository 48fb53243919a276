"""``multikey``: the target key/value pair among distractor pairs with other names (RULER's MK-NIAH).

Template fields: as ``needle`` (``{name}``, ``{key}``); distractors use the same needle form with other
names and keys, at uniformly random depths. Option ``distractors`` (default 3).
"""

from __future__ import annotations

from ctxext.tasks.base import Prompt, Task, draw_keys, draw_names, encode, fill
from ctxext.tasks.needle import KV_TEMPLATES
from ctxext.tasks.registry import register_task


@register_task
class MultiKey(Task):
    """One target key among distractor keys."""

    name = "multikey"
    description = "the target key/value pair among distractor pairs; asks for the target's value"
    templates = KV_TEMPLATES
    heldout = (4,)
    options = {"distractors": 3}

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt:  # noqa: D102
        n = 1 + opts["distractors"]
        names, keys = draw_names(rng, n), draw_keys(rng, n)
        depths = [depth] + [rng.random() for _ in range(n - 1)]
        inserts = [
            (d, encode(tokenizer, fill(tpl.needle, name=nm, key=k)))
            for d, nm, k in zip(depths, names, keys, strict=True)
        ]
        answer = fill(tpl.answer, name=names[0], key=keys[0])
        distractors = dict(zip(names[1:], keys[1:], strict=True))
        return Prompt(
            inserts=inserts,
            question=fill(tpl.question, name=names[0], key=keys[0]),
            answer=answer,
            fields={"name": names[0], "key": keys[0], "distractors": distractors},
            answer_prefix=fill(tpl.answer_prefix, name=names[0], key=keys[0]),
        )
