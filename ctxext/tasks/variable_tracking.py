"""``variable_tracking``: a chain of assignments ``X1 = key; X2 = X1; …``; asks for the last one's value.

RULER's variable tracking asks for every name bound to the value; asking for the last link's value
keeps the answer one key (multi-hop tracing either way) and scores teacher-forced exactly.

Template fields: needle (the first assignment) ``{name}``, ``{key}``; link (each later step)
``{name}``, ``{prev}``; question and answer prefix ``{name}`` (the last variable); answer ``{key}``. The chain starts at
the depth asked for; later links follow at random depths after it. Options ``hops`` (links after the
first assignment, default 4) and ``distractors`` (other chains with other values, default 0).
"""

from __future__ import annotations

from ctxext.tasks.base import Prompt, Task, Template, draw_keys, draw_names, encode, fill
from ctxext.tasks.registry import register_task

VARIABLE_TRACKING_TEMPLATES = (
    Template(
        needle="\nX_{name} = {key}\n",
        link="\nX_{name} = X_{prev}\n",
        answer_prefix="\nassert X_{name} ==",
        answer=" {key}",
    ),
    Template(
        needle="\n{name}_value = {key}\n",
        link="\n{name}_value = {prev}_value\n",
        answer_prefix="\nassert {name}_value ==",
        answer=" {key}",
    ),
    Template(
        needle="\n# let {name} = {key}\n",
        link="\n# let {name} = {prev}\n",
        answer_prefix="\n# so {name} =",
        answer=" {key}",
    ),
    Template(
        needle=" VAR {name} = {key} ",
        link=" VAR {name} = VAR {prev} ",
        question=" Question: what is the value of VAR {name}?",
        answer_prefix=" Answer: VAR {name} =",
        answer=" {key}",
        stop=(".", "\n"),
    ),
    Template(
        needle="\nv_{name} = {key}\n",
        link="\nv_{name} = v_{prev}\n",
        answer_prefix="\nassert v_{name} ==",
        answer=" {key}",
    ),
)


@register_task
class VariableTracking(Task):
    """Multi-hop tracing through chained assignments."""

    name = "variable_tracking"
    description = "chained assignments X2 = X1 …; asks for the last variable's value"
    templates = VARIABLE_TRACKING_TEMPLATES
    heldout = (4,)
    options = {"hops": 4, "distractors": 0}

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt:  # noqa: D102
        hops, chains = opts["hops"], 1 + opts["distractors"]
        names = draw_names(rng, chains * (hops + 1))
        keys = draw_keys(rng, chains)
        inserts: list[tuple[float, list[int]]] = []
        chain_names: list[list[str]] = []
        for c in range(chains):
            start = depth if c == 0 else rng.random()
            link_depths = sorted(rng.uniform(start, 1.0) for _ in range(hops))
            own = names[c * (hops + 1) : (c + 1) * (hops + 1)]
            chain_names.append(own)
            inserts.append((start, encode(tokenizer, fill(tpl.needle, name=own[0], key=keys[c]))))
            for j, d in enumerate(link_depths, start=1):
                inserts.append((d, encode(tokenizer, fill(tpl.link, name=own[j], prev=own[j - 1]))))
        # Stable sort by depth: a chain's links keep their order where depths round to one position.
        inserts.sort(key=lambda t: t[0])
        last = chain_names[0][-1]
        answer = fill(tpl.answer, name=last, key=keys[0])
        fields = {"chain": chain_names[0], "key": keys[0], "distractor_chains": chain_names[1:]}
        return Prompt(inserts, fill(tpl.question, name=last), answer, fields, None, fill(tpl.answer_prefix, name=last))
