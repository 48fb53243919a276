"""``mrcr``: a long conversation of request → response rounds; repeat the response to the K-th identical request.

Multi-round coreference, simplified from OpenAI-MRCR (as used by HELMET and lm-eval): the conversation
fills the sample, as many rounds as fit between the prefix and the question (a few haystack tokens make
up the rest, before it). Each round asks for something about a topic and is answered with a random
response (two random 3-letter words, distinct over the sample, so no model knows them). One topic is
requested three times, each answered differently; the question asks to repeat the response to its
``occurrence``-th request (option, 1–3, default 2), so the model must count identical requests, not just
find one. The asked round sits at the depth asked for *within the conversation* (0: its first round, 1:
its last), moved by as few rounds as it takes to leave room for the identical requests before and after
it. The other rounds request other topics (which repeat among themselves). Scored on the response.

Template fields: ``item`` is one round (``{topic}``, ``{response}``), ``join`` separates rounds,
``needle`` opens the conversation and ``link`` closes it; question and answer prefix ``{ordinal}`` (first,
second, third), ``{topic}``; answer ``{response}``.
"""

from __future__ import annotations

import random

from ctxext.errors import InputError
from ctxext.tasks.base import Prompt, Task, TaskSample, Template, draw_words, encode, encode_prefix, fill
from ctxext.tasks.registry import register_task

MRCR_TEMPLATES = (
    Template(
        item="\nUser: write a line about {topic}\nAssistant: {response}\n",
        join="",
        question="\nUser: repeat your answer to the {ordinal} request to write a line about {topic}",
        answer_prefix="\nAssistant:",
        answer=" {response}",
    ),
    Template(
        item="\nQ: give me a word for {topic}\nA: {response}\n",
        join="",
        question="\nQ: what did you answer the {ordinal} time I asked for a word for {topic}?",
        answer_prefix="\nA:",
        answer=" {response}",
    ),
    Template(
        prefix="Repeat the response the user asks for, exactly.",
        needle="\n\nConversation:",
        item="\n\nUser: Write a poem about {topic}.\n\nAssistant: {response}",
        join="",
        question="\n\nUser: Return the {ordinal} poem about {topic}.",
        answer_prefix="\n\nAssistant:",
        answer=" {response}",
    ),
    Template(
        needle="\nlog = [",
        item="\n    ('{topic}', '{response}'),",
        join="",
        link="\n]\n",
        answer_prefix="\n# the reply logged for the {ordinal} entry '{topic}' above is",
        answer=" '{response}'",
        stop=("\n", ","),
    ),
    Template(
        item="\n- request: a note on {topic}\n  reply: {response}",
        join="",
        answer_prefix="\n# the reply to the {ordinal} request for a note on {topic}:",
        answer=" {response}",
    ),
)

ORDINALS = ("first", "second", "third")
COPIES = 3  # how often the asked request occurs
TOPICS = 8  # distinct topics: the asked one and the distractors' pool


def layout(n: int, depth: float, occurrence: int, rng: random.Random) -> tuple[list[int], int]:
    """The topic index of each of ``n`` rounds (0: the asked topic) and the asked round's index.

    The asked round is the ``occurrence``-th of the :data:`COPIES` rounds with topic 0; it sits at
    ``round(depth * (n - 1))``, moved just enough to fit the other copies before and after it.
    """
    before, after = occurrence - 1, COPIES - occurrence
    target = min(max(round(depth * (n - 1)), before), n - 1 - after)
    topics = [rng.randrange(1, TOPICS) for _ in range(n)]
    for i in [target, *rng.sample(range(target), before), *rng.sample(range(target + 1, n), after)]:
        topics[i] = 0
    return topics, target


@register_task
class MRCR(Task):
    """Repeat the response to the K-th of several identical requests in a long conversation."""

    name = "mrcr"
    description = "a long conversation with repeated requests; repeat the response to the K-th one (OpenAI-MRCR)"
    templates = MRCR_TEMPLATES
    heldout = (4,)
    options = {"occurrence": 2}

    def references(self, sample: TaskSample) -> list[str]:
        """The asked response (without any quotes the template puts around it)."""
        return [sample.fields["response"]]

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt:  # noqa: D102
        k = opts["occurrence"]
        if not 1 <= k <= COPIES:
            raise InputError(f"task mrcr: option occurrence must be 1, 2 or 3 (got {k})")
        prefix = len(encode_prefix(tokenizer, fill(tpl.prefix)))
        names = draw_words(rng, TOPICS)
        sample_response = "abc def"  # a response's shape, for the estimate
        probe = encode(tokenizer, tpl.join + fill(tpl.item, topic=names[0], response=sample_response))
        shell = encode(tokenizer, fill(tpl.needle) + fill(tpl.link))
        ask = fill(tpl.question, ordinal=ORDINALS[k - 1], topic=names[0])
        answer_prefix = fill(tpl.answer_prefix, ordinal=ORDINALS[k - 1], topic=names[0])
        asking = len(encode(tokenizer, ask + answer_prefix))
        qa = asking + len(encode(tokenizer, fill(tpl.answer, response=sample_response)))
        # Two rounds over the estimate, then down to the most that fit: random words tokenize to varying lengths.
        n = max(COPIES, (length - prefix - qa - len(shell)) // max(1, len(probe)) + 2)
        words = draw_words(rng, 2 * n)  # distinct responses: only the asked round's answer is right
        responses = [f"{words[2 * i]} {words[2 * i + 1]}" for i in range(n)]
        while True:
            topics, target = layout(n, depth, k, rng)
            rounds = tpl.join.join(fill(tpl.item, topic=names[t], response=responses[i]) for i, t in enumerate(topics))
            ids = encode(tokenizer, fill(tpl.needle) + rounds + fill(tpl.link))
            answer = fill(tpl.answer, response=responses[target])
            over = prefix + len(ids) + asking + len(encode(tokenizer, answer)) - length
            if over <= 0:
                break
            if n == COPIES:
                raise InputError(
                    f"task mrcr: length {length} cannot hold a conversation of {COPIES} rounds plus the question "
                    f"and answer ({over + length} tokens). Use a length of at least {over + length} tokens."
                )
            n = max(COPIES, n - (over // len(probe) if over > 2 * len(probe) else 1))
        return Prompt(
            # The conversation ends right before the question; the few spare tokens are haystack before it.
            inserts=[(1.0, ids)],
            question=ask,
            answer=answer,
            fields={
                "topic": names[0],
                "response": responses[target],
                "occurrence": k,
                "rounds": n,
                "position": target,
                "copies": [i for i, t in enumerate(topics) if t == 0],
            },
            answer_prefix=answer_prefix,
        )
