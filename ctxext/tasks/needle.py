"""``needle``: one key/value pair hidden in the haystack; the question asks for the key's value.

Template fields: ``{name}`` (a 2-letter name) and ``{key}`` (a 5-digit number) in needle, question, answer
prefix and answer. A custom template without ``{key}`` in its needle is used verbatim (a fixed free-text needle,
e.g. the classic "best thing to do in San Francisco").
"""

from __future__ import annotations

import random
from typing import Any

from ctxext.tasks.base import Haystack, Prompt, Template, draw_keys, draw_names, encode, fill
from ctxext.tasks.base import Task as _Task
from ctxext.tasks.registry import register_task

# Key/value surface forms, shared by the single-needle and multi-key tasks. The code forms suit models
# trained on code (the grown model); the prose form is RULER's. A code form asks nothing: its answer prefix
# (``assert KEY_ab ==``) is the whole ask, which a chat model continues in its own turn.
KV_TEMPLATES = (
    Template(needle="\nKEY_{name} = {key}\n", answer_prefix="\nassert KEY_{name} ==", answer=" {key}"),
    Template(needle="\nconfig['{name}'] = {key}\n", answer_prefix="\nassert config['{name}'] ==", answer=" {key}"),
    Template(
        needle="\n# The secret number of {name} is {key}.\n",
        answer_prefix="\n# The secret number of {name} is",
        answer=" {key}",
        stop=(".", "\n"),
    ),
    Template(
        needle=" One of the special magic numbers for {name} is: {key}. ",
        question=" What is the special magic number for {name} mentioned in the provided text?",
        answer_prefix=" The special magic number for {name} mentioned in the provided text is",
        answer=" {key}",
        stop=(".", "\n"),
    ),
    Template(needle="\n{name}_id = {key}\n", answer_prefix="\nassert {name}_id ==", answer=" {key}"),
)


def single_needle(
    task: _Task,
    tokenizer: Any,
    haystack: Haystack,
    length: int,
    depth: float,
    rng: random.Random,
    tpl: Template,
    index: int | None,
) -> Prompt:
    """A sample with one needle (shared by ``needle`` and ``passkey``), for :meth:`Task.build` to return."""
    keyed = "{key}" in tpl.needle
    fields: dict[str, Any] = {}
    texts: tuple[str, ...] = (tpl.prefix, tpl.needle, tpl.question, tpl.answer_prefix, tpl.answer)
    if keyed:
        # A fresh key (and name) per sample, so a model cannot pass by remembering one answer.
        fields = {"key": draw_keys(rng, 1)[0], "name": draw_names(rng, 1)[0]}
        texts = tuple(fill(t, **fields) for t in texts)
    prefix, needle, question, answer_prefix, answer = texts
    return Prompt([(depth, encode(tokenizer, needle))], question, answer, fields, prefix, answer_prefix)


@register_task
class Needle(_Task):
    """Single key/value needle in real text (RULER's S-NIAH)."""

    name = "needle"
    description = "one key/value pair in the haystack; asks for the value"
    templates = KV_TEMPLATES
    heldout = (4,)

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt:  # noqa: D102
        return single_needle(self, tokenizer, haystack, length, depth, rng, tpl, index)
