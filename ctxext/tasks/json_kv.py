"""``json_kv``: a JSON object of random UUID keys → UUID values; asks for one key's value (HELMET's json_kv).

The object fills the sample: as many pairs as fit between the prefix and the question (a few haystack
tokens make up the rest, before the object). The asked pair sits at the depth asked for *within the
object* (0: its first pair, 1: its last). Keys and values are UUIDs (``8-4-4-4-12`` hex digits) drawn
from the sample's rng; option ``hex`` (default 32) sets their hex digits (32: a UUID; fewer: a plain hex
string, for models with short windows).

Template fields: ``needle`` opens the object, ``item`` is one pair (``{key}``, ``{value}``), ``join``
separates pairs, ``link`` closes the object (literal braces doubled: ``{{``); question and answer prefix
``{key}``; answer ``{value}``.
"""

from __future__ import annotations

import random

from ctxext.errors import InputError
from ctxext.tasks.base import Prompt, Task, TaskSample, Template, encode, encode_prefix, fill
from ctxext.tasks.registry import register_task

JSON_KV_TEMPLATES = (
    Template(
        needle="\ndata = {{",
        item='"{key}": "{value}"',
        link="}}\n",
        answer_prefix='\nassert data["{key}"] ==',
        answer=' "{value}"',
        stop=("\n", ","),
    ),
    Template(
        needle="\nconfig = json.loads('{{",
        item='"{key}": "{value}"',
        link="}}')\n",
        answer_prefix='\nassert config["{key}"] ==',
        answer=' "{value}"',
        stop=("\n", ","),
    ),
    Template(
        needle="\n# lookup table: {{",
        item='"{key}": "{value}"',
        link="}}\n",
        answer_prefix='\n# in the lookup table above, "{key}" maps to',
        answer=' "{value}"',
        stop=("\n", ","),
    ),
    Template(
        prefix="Extract the value corresponding to the specified key in the JSON object below.",
        needle="\n\nJSON data:\n{{",
        item='"{key}": "{value}"',
        link="}}",
        question='\n\nKey: "{key}"',
        answer_prefix="\nCorresponding value:",
        answer=' "{value}"',
    ),
    Template(
        needle="\nmapping = {{\n    ",
        item="'{key}': '{value}'",
        join=",\n    ",
        link=",\n}}\n",
        answer_prefix="\nassert mapping['{key}'] ==",
        answer=" '{value}'",
        stop=("\n", ","),
    ),
)


def draw_uuid(rng: random.Random, hex_digits: int = 32) -> str:
    """A random UUID-like string: ``8-4-4-4-12`` hex digits for 32, else ``hex_digits`` plain hex digits."""
    digits = "".join(rng.choice("0123456789abcdef") for _ in range(hex_digits))
    if hex_digits != 32:
        return digits
    return "-".join(digits[a:b] for a, b in ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32)))


@register_task
class JsonKV(Task):
    """One key's value in a long JSON object of random UUIDs."""

    name = "json_kv"
    description = "a JSON object of random UUID keys and values; asks for one key's value (HELMET json_kv)"
    templates = JSON_KV_TEMPLATES
    heldout = (4,)
    options = {"hex": 32}

    def references(self, sample: TaskSample) -> list[str]:
        """The asked value (without the quotes the template puts around it)."""
        return [sample.fields["value"]]

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt:  # noqa: D102
        if opts["hex"] < 4:
            raise InputError("task json_kv: option hex must be at least 4 (digits of each key and value)")
        probe = draw_uuid(rng, opts["hex"])
        prefix = len(encode_prefix(tokenizer, fill(tpl.prefix)))

        def asked(key: str, value: str) -> tuple[str, str, int]:
            question, answer = fill(tpl.question, key=key), fill(tpl.answer, value=value)
            return (
                question,
                answer,
                len(encode(tokenizer, question + fill(tpl.answer_prefix, key=key))) + len(encode(tokenizer, answer)),
            )

        budget = length - prefix - asked(probe, probe)[2]
        shell = encode(tokenizer, fill(tpl.needle) + fill(tpl.link))
        per_pair = max(1, len(encode(tokenizer, tpl.join + fill(tpl.item, key=probe, value=probe))))
        # Two pairs over the estimate, then down to the most that fit: keys of one shape tokenize to varying lengths.
        n = max(1, (budget - len(shell)) // per_pair + 2)
        keys: list[str] = []
        while len(keys) < n:  # distinct keys (a collision is astronomically rare, but would make two answers)
            k = draw_uuid(rng, opts["hex"])
            if k not in keys:
                keys.append(k)
        values = [draw_uuid(rng, opts["hex"]) for _ in range(n)]
        while True:
            items = tpl.join.join(fill(tpl.item, key=k, value=v) for k, v in zip(keys[:n], values[:n], strict=True))
            ids = encode(tokenizer, fill(tpl.needle) + items + fill(tpl.link))
            target = round(depth * (n - 1))
            question, answer, qa_tokens = asked(keys[target], values[target])
            # Counted with the asked key itself: keys of one shape may still tokenize to different lengths.
            over = prefix + len(ids) + qa_tokens - length
            if over <= 0:
                break
            if n == 1:
                raise InputError(
                    f"task json_kv: length {length} cannot hold a JSON object with one pair plus the question and "
                    f"answer ({prefix + len(ids) + qa_tokens} tokens). Use a longer length or a smaller option hex."
                )
            n = max(1, n - (over // per_pair if over > 2 * per_pair else 1))
        key, value = keys[target], values[target]
        return Prompt(
            # The object ends right before the question; the few spare tokens are haystack before it.
            inserts=[(1.0, ids)],
            question=question,
            answer=answer,
            fields={"key": key, "value": value, "pairs": n, "position": target},
            answer_prefix=fill(tpl.answer_prefix, key=key),
        )
