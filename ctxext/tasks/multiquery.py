"""``multiquery``: several key/value pairs; one question asks for all of them (RULER's MQ-NIAH).

Template fields: needle ``{name}``, ``{key}``; ``item`` ``{name}`` (one queried name as the question
writes it); question and answer prefix ``{items}`` (the items joined by ``join``); answer ``{keys}`` (the values in the
order asked). The first pair sits at the depth asked for, the others at random depths. Option
``queries`` (default 2).
"""

from __future__ import annotations

from ctxext.tasks.base import Prompt, Task, TaskSample, Template, draw_keys, draw_names, encode, fill
from ctxext.tasks.registry import register_task

MULTIQUERY_TEMPLATES = (
    Template(
        needle="\nKEY_{name} = {key}\n",
        item="KEY_{name}",
        answer_prefix="\nassert ({items}) == (",
        answer="{keys}",
        stop=(")", "\n"),
    ),
    Template(
        needle="\nconfig['{name}'] = {key}\n",
        item="config['{name}']",
        answer_prefix="\nassert ({items}) == (",
        answer="{keys}",
        stop=(")", "\n"),
    ),
    Template(
        needle="\n# The secret number of {name} is {key}.\n",
        answer_prefix="\n# The secret numbers of {items} are",
        answer=" {keys}",
        stop=(".", "\n"),
    ),
    Template(
        needle=" One of the special magic numbers for {name} is: {key}. ",
        question=" What are the special magic numbers for {items} mentioned in the provided text?",
        answer_prefix=" The special magic numbers for {items} mentioned in the provided text are",
        answer=" {keys}",
        stop=(".", "\n"),
    ),
    Template(
        needle="\n{name}_id = {key}\n",
        item="{name}_id",
        answer_prefix="\nassert ({items}) == (",
        answer="{keys}",
        stop=(")", "\n"),
    ),
)


@register_task
class MultiQuery(Task):
    """Several keys asked at once."""

    name = "multiquery"
    description = "several key/value pairs; asks for all values at once"
    templates = MULTIQUERY_TEMPLATES
    heldout = (4,)
    options = {"queries": 2}

    def references(self, sample: TaskSample) -> list[str]:
        """Every queried value: a generated answer scores the fraction of them it names (RULER's MQ-NIAH)."""
        return [str(k) for k in sample.fields["keys"]]

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt:  # noqa: D102
        n = max(1, opts["queries"])
        names, keys = draw_names(rng, n), draw_keys(rng, n)
        depths = [depth] + [rng.random() for _ in range(n - 1)]
        inserts = [
            (d, encode(tokenizer, fill(tpl.needle, name=nm, key=k)))
            for d, nm, k in zip(depths, names, keys, strict=True)
        ]
        items = tpl.join.join(fill(tpl.item, name=nm) for nm in names)
        answer = fill(tpl.answer, keys=tpl.join.join(str(k) for k in keys))
        asked = {"names": names, "keys": keys}
        question, answer_prefix = fill(tpl.question, items=items), fill(tpl.answer_prefix, items=items)
        return Prompt(inserts, question, answer, asked, None, answer_prefix)
