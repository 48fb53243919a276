"""``copy_span``: a marked span of haystack text; asks to repeat it (copying / induction over distance).

The span is ``span`` tokens of the haystack taken at a random offset, wrapped by the template's needle
(opening marker) and link (closing marker), at the depth asked for; the answer is the span's tokens
themselves (not re-tokenized). Template fields: ``{name}`` in needle, link and question. Option
``span`` (tokens, default 16).
"""

from __future__ import annotations

from ctxext.errors import InputError
from ctxext.tasks.base import Prompt, Task, Template, draw_names, encode, fill
from ctxext.tasks.registry import register_task

COPY_TEMPLATES = (
    Template(needle="\n# begin block {name}\n", link="\n# end block {name}\n", question="\n# repeat block {name}\n"),
    Template(needle="\nBLOCK_{name} = '''\n", link="\n'''\n", question="\nassert BLOCK_{name} == '''\n"),
    Template(
        needle=" Here is passage {name}: ",
        link=" (end of passage {name}) ",
        question=" Repeat passage {name} word for word: ",
    ),
    Template(needle="\n<{name}>\n", link="\n</{name}>\n", question="\n<{name} again>\n"),
    Template(needle="\n# --- {name} ---\n", link="\n# --- end {name} ---\n", question="\n# copy of {name}:\n"),
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
        return Prompt([(depth, needle)], fill(tpl.question, name=name), list(span), {"name": name})
