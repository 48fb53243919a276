"""``copy_span``: a marked span of haystack text; asks to repeat it (copying / induction over distance).

The span is ``span`` tokens of the haystack taken at a random offset, wrapped by the template's needle
(opening marker) and link (closing marker), at the depth asked for; the answer is the span's tokens
themselves (not re-tokenized). Template fields: ``{name}`` in needle, link, question and answer prefix; a
template's ``stop`` is its closing marker (the span itself may hold newlines). Option
``span`` (tokens, default 16).
"""

from __future__ import annotations

from ctxext.errors import InputError
from ctxext.tasks.base import Prompt, Task, Template, draw_names, encode, fill
from ctxext.tasks.registry import register_task

COPY_TEMPLATES = (
    Template(
        needle="\n# begin block {name}\n",
        link="\n# end block {name}\n",
        answer_prefix="\n# repeat block {name}\n",
        stop=("\n# end block",),
    ),
    Template(
        needle="\nBLOCK_{name} = '''\n",
        link="\n'''\n",
        answer_prefix="\nassert BLOCK_{name} == '''\n",
        stop=("'''",),
    ),
    Template(
        needle=" Here is passage {name}: ",
        link=" (end of passage {name}) ",
        question=" Repeat passage {name} word for word.",
        answer_prefix=" Passage {name}:",
        stop=(" (end of passage",),
    ),
    Template(
        needle="\n<{name}>\n",
        link="\n</{name}>\n",
        answer_prefix="\n<{name} again>\n",
        stop=("\n</",),
    ),
    Template(
        needle="\n# --- {name} ---\n",
        link="\n# --- end {name} ---\n",
        answer_prefix="\n# copy of {name}:\n",
        stop=("\n# --- end",),
    ),
)


@register_task
class CopySpan(Task):
    """Repeat a marked span."""

    name = "copy_span"
    description = "a marked span of the haystack; asks to repeat it verbatim"
    templates = COPY_TEMPLATES
    heldout = (4,)
    options = {"span": 16}

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt:  # noqa: D102
        if opts["span"] < 1:
            raise InputError("task copy_span: option span must be at least 1 token")
        name = draw_names(rng, 1)[0]
        span = haystack.take(opts["span"], rng.randrange(len(haystack)))
        needle = encode(tokenizer, fill(tpl.needle, name=name)) + span + encode(tokenizer, fill(tpl.link, name=name))
        question, answer_prefix = fill(tpl.question, name=name), fill(tpl.answer_prefix, name=name)
        return Prompt([(depth, needle)], question, list(span), {"name": name}, None, answer_prefix)
