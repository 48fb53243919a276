"""``passkey``: Landmark Attention's passkey retrieval — a 5-digit key in the repetitive noise haystack.

Template fields: ``{key}`` (and ``{name}``, unused by the shipped forms). Template 0 is the original
prompt (Mohtashami & Jaggi 2023), used by ``ctxext eval passkey`` and the merge check; its question ("What is
the pass key?") asks and its answer prefix ("The pass key is") starts the answer, as in RULER.
"""

from __future__ import annotations

from ctxext.tasks.base import Prompt, Task, Template
from ctxext.tasks.needle import single_needle
from ctxext.tasks.registry import register_task

PASSKEY_PREFIX = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)

PASSKEY_TEMPLATES = (
    Template(
        prefix=PASSKEY_PREFIX,
        needle=" The pass key is {key}. Remember it. {key} is the pass key.",
        question=" What is the pass key?",
        answer_prefix=" The pass key is",
        answer=" {key}",
        stop=(".", "\n"),
    ),
    Template(
        prefix=PASSKEY_PREFIX,
        needle=" The secret code is {key}. Keep it in mind. {key} is the secret code.",
        question=" What is the secret code?",
        answer_prefix=" The secret code is",
        answer=" {key}",
        stop=(".", "\n"),
    ),
    Template(
        prefix="Somewhere in the text below there is a number to remember.",
        needle=" Remember this number: {key}. The number to remember is {key}.",
        question=" What is the number to remember?",
        answer_prefix=" The number to remember is",
        answer=" {key}",
        stop=(".", "\n"),
    ),
)


@register_task
class Passkey(Task):
    """The passkey in noise."""

    name = "passkey"
    description = "a 5-digit pass key in repetitive noise (Landmark Attention)"
    templates = PASSKEY_TEMPLATES
    heldout = (2,)
    haystack = "noise"

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt:  # noqa: D102
        return single_needle(self, tokenizer, haystack, length, depth, rng, tpl, index)
