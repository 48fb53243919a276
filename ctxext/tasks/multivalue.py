"""``multivalue``: several values stored under one name; the answer lists them in document order (MV-NIAH).

Template fields: needle ``{name}``, ``{key}`` (one value); question and answer prefix ``{name}``; answer ``{keys}`` (the
values joined by the template's ``join``). The first value sits at the depth asked for, the others at
uniformly random depths. Option ``values`` (default 4).
"""

from __future__ import annotations

from ctxext.tasks.base import Prompt, Task, TaskSample, Template, draw_keys, draw_names, encode, fill
from ctxext.tasks.registry import register_task

MULTIVALUE_TEMPLATES = (
    Template(
        needle="\nKEY_{name}.append({key})\n",
        answer_prefix="\nassert KEY_{name} == [",
        answer="{keys}",
        stop=("]", "\n"),
    ),
    Template(
        needle="\nconfig['{name}'].append({key})\n",
        answer_prefix="\nassert config['{name}'] == [",
        answer="{keys}",
        stop=("]", "\n"),
    ),
    Template(
        needle="\n# One secret number of {name} is {key}.\n",
        answer_prefix="\n# The secret numbers of {name} are",
        answer=" {keys}",
        stop=(".", "\n"),
    ),
    Template(
        needle=" One of the special magic numbers for {name} is: {key}. ",
        question=" What are all the special magic numbers for {name} mentioned in the provided text?",
        answer_prefix=" The special magic numbers for {name} mentioned in the provided text are",
        answer=" {keys}",
        stop=(".", "\n"),
    ),
    Template(
        needle="\n{name}_ids.append({key})\n",
        answer_prefix="\nassert {name}_ids == [",
        answer="{keys}",
        stop=("]", "\n"),
    ),
)


@register_task
class MultiValue(Task):
    """All values of one name."""

    name = "multivalue"
    description = "several values under one name; asks for all of them, in order"
    templates = MULTIVALUE_TEMPLATES
    heldout = (4,)
    options = {"values": 4}

    def references(self, sample: TaskSample) -> list[str]:
        """Every value: a generated answer scores the fraction of them it names (RULER's MV-NIAH)."""
        return [str(k) for k in sample.fields["keys"]]

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt:  # noqa: D102
        n = max(1, opts["values"])
        name = draw_names(rng, 1)[0]
        keys = draw_keys(rng, n)
        # Sorted by depth, so list order is document order (ties keep it too).
        placed = sorted(zip([depth] + [rng.random() for _ in range(n - 1)], keys, strict=True), key=lambda t: t[0])
        in_order = [k for _, k in placed]
        joined = tpl.join.join(str(k) for k in in_order)
        answer = fill(tpl.answer, name=name, keys=joined)
        return Prompt(
            inserts=[(d, encode(tokenizer, fill(tpl.needle, name=name, key=k))) for d, k in placed],
            question=fill(tpl.question, name=name),
            answer=answer,
            fields={"name": name, "keys": in_order},
            answer_prefix=fill(tpl.answer_prefix, name=name),
        )
