"""Many keys in one long input: needles at several depths, then one question and answer per needle.

At long lengths a forward pass is the cost (a 32k-token pass of a 135M model takes ~6 minutes on two CPU
cores), and one needle per pass spends it on one trial. A key set hides ``k`` key/value needles (fresh names and
keys, the needle task's forms) at the depths asked for, then asks for each of them in turn, in a shuffled
order, each answer written after its question::

    [prefix] [haystack with k needles at their depths] [q_1] [a_1] [q_2] [a_2] … [q_k] [a_k]

Each ``q`` is the template's question and answer prefix as one text, as a single-needle prompt ends. With a
chat template (:class:`~ctxext.tasks.base.ChatWrap`) the input is a conversation: the first user message holds
the haystack and the first question, each answer is an assistant turn opened by its answer prefix, and each
later question is a user turn of its own::

    [head] [prefix] [haystack] [q_1] [tail] [p_1] [a_1] [turn] [q_2] [tail] [p_2] [a_2] …

Scored teacher-forced (:func:`ctxext.scoring.answers.score_answer_sets`), every answer is correct iff greedy
decoding, given everything before it, writes it: one pass scores ``k`` trials. The earlier answers are other
keys, so they give nothing of a later one away; all trials of one input share its haystack, so their
statistics are clustered by input (:func:`ctxext.scoring.stats.cluster_rate`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from ctxext.errors import InputError
from ctxext.tasks.base import ChatWrap, Haystack, Template, draw_keys, draw_names, encode, encode_prefix, fill
from ctxext.tasks.needle import KV_TEMPLATES


@dataclass
class KeySet:
    """One input holding several retrieval trials.

    Attributes:
        ids: the token ids, exactly the length asked for.
        spans: ``(start, end)`` of each answer, in the order asked.
        depths: the depth (0–1) of the needle each answer retrieves, in the same order.
        keys: the keys asked for, in the same order.
        distances: tokens from each needle's end to its answer's start.
        needle_spans: ``(start, end)`` of every needle in ``ids``, in the order asked.
        filler: ``(start, end)`` of the haystack's stretch (needles inside it excluded via ``needle_spans``).
        fields: what was drawn, JSON-ready.
    """

    ids: list[int]
    spans: list[tuple[int, int]]
    depths: list[float]
    keys: list[int]
    distances: list[int]
    needle_spans: list[tuple[int, int]] = field(default_factory=list)
    filler: tuple[int, int] = (0, 0)
    fields: dict[str, Any] = field(default_factory=dict)


def spread_depths(keys: int, index: int, count: int) -> list[float]:
    """The needle depths (0–1) of input ``index`` of ``count``, ``keys`` needles in each.

    Evenly over the input, shifted from input to input so that the inputs together cover every depth: with one key
    each, the ``count`` inputs' needles stand evenly from 0 to 1, none at the very edges.
    """
    shift = (index + 0.5) / count
    return [(k + shift) / keys for k in range(keys)]


def make_keyset(
    tokenizer: Any,
    haystack: Haystack,
    length: int,
    depths: list[float],
    rng: random.Random,
    template: int | Template = 0,
    offset: int | None = None,
    chat: ChatWrap | None = None,
) -> KeySet:
    """A key set of ``len(depths)`` needles, one per depth (0–1), exactly ``length`` tokens long.

    Args:
        tokenizer: the model's tokenizer.
        haystack: the filler (real text, so the model must find the needles in it).
        length: total tokens.
        depths: where each needle goes in the filler, 0 (start) to 1 (end).
        rng: the only source of randomness (names, keys, haystack offset, the order of the questions).
        template: a :data:`ctxext.tasks.needle.KV_TEMPLATES` index or a custom :class:`Template`.
        offset: where the filler starts in the haystack (default: drawn by ``rng``; 0 with a haystack of one
            document starts at its beginning, the truncated-document protocol).
        chat: a chat template's tokens (:func:`ctxext.tasks.chat.chat_wrap`): the questions become a conversation.

    Raises:
        InputError: no depths, a depth outside 0–1, a length too short for the needles and questions, or a chat
            template that cannot hold several turns.
    """
    if not depths:
        raise InputError("a key set needs at least one depth")
    if any(not 0.0 <= d <= 1.0 for d in depths):
        raise InputError(f"key set depths {depths} must be between 0 and 1")
    tpl = template if isinstance(template, Template) else KV_TEMPLATES[template]
    n = len(depths)
    names, keys = draw_names(rng, n), draw_keys(rng, n)
    needles = [encode(tokenizer, fill(tpl.needle, name=nm, key=k)) for nm, k in zip(names, keys, strict=True)]
    order = list(range(n))
    rng.shuffle(order)
    asks = _asks(
        tokenizer,
        tpl,
        [{"name": names[i], "key": keys[i]} for i in order],
        [fill(tpl.answer, key=keys[i]) for i in order],
        chat,
    )
    head = _head(tokenizer, tpl, chat)
    fixed = len(head) + sum(map(len, needles)) + sum(len(q) + len(a) for q, a in asks)
    n_fill = length - fixed
    if n_fill < 0:
        raise InputError(f"a key set of {n} needles needs at least {fixed} tokens; length {length} is too short")
    offset = rng.randrange(len(haystack)) if offset is None else offset
    stream = haystack.take(n_fill, offset)
    # Needles at their depths in the filler; equal depths keep the order given.
    placed = sorted(((round(d * n_fill), i) for i, d in enumerate(depths)), key=lambda t: t)
    ids, ends, cursor = list(head), [0] * n, 0
    for pos, i in placed:
        ids += stream[cursor:pos]
        cursor = pos
        ids += needles[i]
        ends[i] = len(ids)
    ids += stream[cursor:]
    filler = (len(head), len(ids))
    spans: list[tuple[int, int]] = []
    for question, answer in asks:
        ids += question
        spans.append((len(ids), len(ids) + len(answer)))
        ids += answer
    return KeySet(
        ids=ids,
        spans=spans,
        depths=[depths[i] for i in order],
        keys=[keys[i] for i in order],
        distances=[start - ends[i] for (start, _), i in zip(spans, order, strict=True)],
        needle_spans=[(ends[i] - len(needles[i]), ends[i]) for i in order],
        filler=filler,
        fields={"names": [names[i] for i in order], "haystack_offset": offset},
    )


def make_json_keyset(
    tokenizer: Any,
    haystack: Haystack,
    length: int,
    depths: list[float],
    rng: random.Random,
    template: int = 0,
    hex_digits: int = 8,
    chat: ChatWrap | None = None,
) -> KeySet:
    """Key-value lookup with several queries: a JSON-like object of random keys, then one question per depth.

    The object fills the input (HELMET's json_kv); each question asks for the value of the pair at its depth of
    the object, its answer after it (``keys`` holds the asked pairs' indices). Every pair is a distractor of
    every other, so the model must look a key up, not find the one odd sentence. A few haystack tokens before
    the object make the length exact.

    Args:
        tokenizer: the model's tokenizer.
        haystack: filler for the few tokens the object leaves.
        length: total tokens.
        depths: where each asked pair sits in the object, 0 (first pair) to 1 (last), distinct pairs.
        rng: the only source of randomness.
        template: a :data:`ctxext.tasks.json_kv.JSON_KV_TEMPLATES` index.
        hex_digits: digits of each key and value (32: a UUID; fewer: easier to copy).
        chat: a chat template's tokens: the questions become a conversation (as :func:`make_keyset`'s).

    Raises:
        InputError: no depths, two depths on one pair, a length too short, or a chat template that cannot hold
            several turns.
    """
    from ctxext.tasks.json_kv import JSON_KV_TEMPLATES, draw_uuid

    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise InputError(f"a key-value set needs depths between 0 and 1 (got {depths})")
    tpl = JSON_KV_TEMPLATES[template]
    head = _head(tokenizer, tpl, chat)
    probe = draw_uuid(rng, hex_digits)
    qa = sum(map(len, _asks(tokenizer, tpl, [{"key": probe}], [fill(tpl.answer, value=probe)], chat)[0]))
    per_pair = max(1, len(encode(tokenizer, tpl.join + fill(tpl.item, key=probe, value=probe))))
    n = max(len(depths), (length - len(head) - len(depths) * qa) // per_pair + 2)
    keys = list(dict.fromkeys(draw_uuid(rng, hex_digits) for _ in range(n + 8)))[:n]
    values = [draw_uuid(rng, hex_digits) for _ in range(len(keys))]
    order = list(range(len(depths)))
    rng.shuffle(order)
    while True:
        n = min(n, len(keys))
        targets = [round(depths[i] * (n - 1)) for i in order]
        if len(set(targets)) != len(targets):
            raise InputError(f"key-value set depths {depths} ask for one pair twice at {n} pairs; spread them out")
        items = tpl.join.join(fill(tpl.item, key=k, value=v) for k, v in zip(keys[:n], values[:n], strict=True))
        obj = encode(tokenizer, fill(tpl.needle) + items + fill(tpl.link))
        answers = [fill(tpl.answer, value=values[t]) for t in targets]
        asks = _asks(tokenizer, tpl, [{"key": keys[t]} for t in targets], answers, chat)
        over = len(head) + len(obj) + sum(len(q) + len(a) for q, a in asks) - length
        if over <= 0:
            break
        if n <= len(depths):
            raise InputError(f"a key-value set of {len(depths)} queries does not fit in {length} tokens")
        n = max(len(depths), n - max(1, over // per_pair))
    pad = haystack.take(-over, 0)
    ids = list(head) + pad + obj
    spans: list[tuple[int, int]] = []
    for q, a in asks:
        ids += q
        spans.append((len(ids), len(ids) + len(a)))
        ids += a
    start = len(head) + len(pad)
    return KeySet(
        ids=ids,
        spans=spans,
        depths=[depths[i] for i in order],
        keys=list(targets),
        distances=[s - (start + len(obj)) for s, _ in spans],
        filler=(start, start + len(obj)),
        fields={"pairs": n, "asked": [keys[t] for t in targets], "values": [values[t] for t in targets]},
    )


def _head(tokenizer: Any, tpl: Template, chat: ChatWrap | None) -> list[int]:
    """The input's start: the task description with the tokenizer's defaults, or after a chat template's head."""
    if chat is None:
        return encode_prefix(tokenizer, fill(tpl.prefix))
    return chat.head + encode(tokenizer, fill(tpl.prefix))


def _asks(
    tokenizer: Any, tpl: Template, fields: list[dict[str, Any]], answers: list[str], chat: ChatWrap | None
) -> list[tuple[list[int], list[int]]]:
    """Each question's ids (what comes between the previous answer and this one) and its answer's ids.

    Plain: the question and answer prefix as one text, then the answer. In a chat: the previous assistant turn's
    end and a user header (:attr:`ChatWrap.turn`, from the second question on), the question, the template's
    tail, the answer prefix without its leading whitespace, then the answer.
    """
    if chat is not None and len(answers) > 1 and chat.turn is None:
        raise InputError(
            f"the chat template ({chat.source}) renders a second user turn differently from the first, so several "
            "questions cannot follow one another in it: use one question per input, or no chat template"
        )
    out = []
    for i, (given, answer) in enumerate(zip(fields, answers, strict=True)):
        question, prefix = fill(tpl.question, **given), fill(tpl.answer_prefix, **given)
        if chat is None:
            out.append((encode(tokenizer, question + prefix), encode(tokenizer, answer)))
            continue
        lead = prefix.lstrip()
        turn = list(chat.turn or []) if i else []
        asked = turn + encode(tokenizer, question.lstrip() if i else question) + chat.tail + encode(tokenizer, lead)
        out.append((asked, encode(tokenizer, answer if lead else answer.lstrip())))
    return out
