"""``rerank``: numbered passages; asks for the ids of those that mention a query name (HELMET re-ranking).

HELMET's re-ranking task, simplified for teacher-forced scoring: a list of ``passages`` short passages
(option; 0, the default: as many as fit), each opened by a header with its id (template ``needle``,
``{id}``, ids 1…N in order) and made of a haystack snippet (code or text, ``SNIPPET_TOKENS`` tokens
from a random place) with one name mentioned inside it (template ``link``, ``{name}``). Exactly
``relevant`` passages (option; 0, the default: 1–3 drawn per sample) mention the query name, every
other passage mentions a different name (a distractor). The question asks for the ids of the passages
that mention the query, in document order; the answer lists them (items ``item``, ``{id}``, joined by
``join``). The first relevant passage sits at the depth asked for *within the list* (0: the first
passage; 1: as late as the other relevant passages, placed at random after it, allow). The list fills
the sample and ends right before the question. Names are random 3-letter words (``abc_def``), so no
model knows them from pretraining. Scored with RULER's ``string_match_all`` on the ids (the fraction
of relevant ids found) besides the grid's teacher-forced exact match.

Every item is delimited on both sides (``[3]``, ``(3)``, ``<doc 3>``), so RULER's substring match cannot
find id 1 inside id 12.

Template fields: needle ``{id}``; link ``{name}``; item ``{id}``; question and answer prefix ``{name}``; answer
``{ids}``.
"""

from __future__ import annotations

import random
from typing import Any

from ctxext.errors import InputError
from ctxext.tasks.base import Haystack, Prompt, Task, TaskSample, Template, draw_words, encode, encode_prefix, fill
from ctxext.tasks.registry import register_task

# Haystack tokens per passage: long enough to read as a snippet, short enough for many passages per window.
SNIPPET_TOKENS = 12
# The number of relevant passages drawn per sample when option ``relevant`` is 0 (HELMET asks for a ranking
# of a few gold passages among many).
RELEVANT_RANGE = (1, 3)

RERANK_TEMPLATES = (
    Template(
        needle="\n\n[{id}] ",
        link=" {name} ",
        answer_prefix="\n\n# passages that mention {name}, in order:",
        answer=" {ids}",
        item="[{id}]",
        join=" ",
    ),
    Template(
        needle="\n\n# passage ({id})\n",
        link=" {name}() ",
        answer_prefix="\n\n# passages calling {name}():",
        answer=" {ids}",
        item="({id})",
        join=", ",
    ),
    Template(
        needle="\n\n--- snippet [{id}] ---\n",
        link=" {name} ",
        answer_prefix="\n\n# ids of the snippets using {name}:",
        answer=" {ids}",
        item="[{id}]",
        join=" ",
    ),
    Template(
        prefix="You are given a query and passages, each with an ID. List the IDs of the passages that mention the "
        "query, in the order they appear.",
        needle="\n\n[{id}] ",
        link=" {name} ",
        question="\n\nQuery: {name}",
        answer_prefix="\nRelevant passage IDs:",
        answer=" {ids}",
        item="[{id}]",
        join=" ",
    ),
    Template(
        needle="\n\n<doc {id}>\n",
        link=" {name} ",
        answer_prefix="\n\n# docs mentioning {name}:",
        answer=" {ids}",
        item="<doc {id}>",
        join=" ",
    ),
)


def pick_relevant(rng: random.Random, n: int, k: int, depth: float) -> list[int]:
    """The 0-based indices of the ``k`` relevant passages among ``n``: the first at ``depth``, the rest after it."""
    first = min(round(depth * (n - 1)), n - k)
    return [first, *sorted(rng.sample(range(first + 1, n), k - 1))]


@register_task
class Rerank(Task):
    """The ids of the passages that mention a name, in document order."""

    name = "rerank"
    description = "numbered passages; asks for the ids of those mentioning a name, in order (HELMET re-ranking)"
    templates = RERANK_TEMPLATES
    heldout = (4,)
    options = {"passages": 0, "relevant": 0}

    def references(self, sample: TaskSample) -> list[str]:
        """Each relevant passage's id as the template writes it (``all``: the fraction found)."""
        return list(sample.fields["items"])

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt:  # noqa: D102
        k = opts["relevant"] or rng.randint(*RELEVANT_RANGE)
        fixed_n = opts["passages"]
        if fixed_n and k > fixed_n:
            raise InputError(f"task rerank: option relevant ({k}) must not exceed option passages ({fixed_n})")
        words = draw_words(rng, 2)
        query = f"{words[0]}_{words[1]}"
        prefix = len(encode_prefix(tokenizer, fill(tpl.prefix)))
        question, answer_prefix = fill(tpl.question, name=query), fill(tpl.answer_prefix, name=query)
        asking = len(encode(tokenizer, question + answer_prefix))
        header = len(encode(tokenizer, fill(tpl.needle, id=99)))
        per = max(1, header + SNIPPET_TOKENS + len(encode(tokenizer, fill(tpl.link, name=query))))
        # Two passages over the estimate, then down to the most that fit (ids and names tokenize to varying lengths).
        n = fixed_n or max(k, (length - prefix - asking) // per + 2)
        parts = _draw_passages(rng, haystack, n, query)
        seed = rng.randrange(2**32)  # the relevant passages are drawn anew for each n tried, reproducibly
        while True:
            relevant = pick_relevant(random.Random(seed), n, k, depth)
            ids, items, answer = _render(tokenizer, tpl, parts[:n], relevant, query)
            over = prefix + len(ids) + asking + len(encode(tokenizer, answer)) - length
            if over <= 0:
                break
            if fixed_n or n <= k:
                need = f"{n} passages ({k} relevant)"
                raise InputError(
                    f"task rerank: length {length} cannot hold {need} plus the question and answer ({over} tokens "
                    "over). Use a longer length, or fewer passages / relevant passages."
                )
            n = max(k, n - (over // per if over > 2 * per else 1))
        return Prompt(
            # The list ends right before the question; the few spare tokens are haystack before it.
            inserts=[(1.0, ids)],
            question=question,
            answer=answer,
            fields={"name": query, "relevant": [r + 1 for r in relevant], "items": items, "passages": n},
            answer_prefix=answer_prefix,
        )


def _draw_passages(rng: random.Random, haystack: Haystack, n: int, query: str) -> list[dict[str, Any]]:
    """Per passage: its snippet, where the name goes in it, and its distractor name (never the query)."""
    parts: list[dict[str, Any]] = []
    for _ in range(n):
        name = query
        while name == query:
            a, b = draw_words(rng, 2)
            name = f"{a}_{b}"
        snippet = haystack.take(SNIPPET_TOKENS, rng.randrange(len(haystack)))
        parts.append({"snippet": snippet, "cut": rng.randint(1, SNIPPET_TOKENS - 1), "name": name})
    return parts


def _render(
    tokenizer: Any, tpl: Template, parts: list[dict[str, Any]], relevant: list[int], query: str
) -> tuple[list[int], list[str], str]:
    """The passage list's ids, the relevant ids as answer items, and the answer text."""
    ids: list[int] = []
    for i, part in enumerate(parts):
        name = query if i in relevant else part["name"]
        snippet, cut = part["snippet"], part["cut"]
        ids += encode(tokenizer, fill(tpl.needle, id=i + 1)) + snippet[:cut]
        ids += encode(tokenizer, fill(tpl.link, name=name)) + snippet[cut:]
    items = [fill(tpl.item, id=r + 1) for r in relevant]
    return ids, items, fill(tpl.answer, ids=tpl.join.join(items))
