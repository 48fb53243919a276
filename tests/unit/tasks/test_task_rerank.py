"""The ``rerank`` task: numbered passages, the relevant ones mention the query, the answer lists their ids."""

from __future__ import annotations

import random
import re

import pytest

from ctxext.errors import InputError
from ctxext.tasks import Haystack, get_task


@pytest.fixture(scope="module")
def hay(tiny_tokenizer):
    from tests.helpers.evaluation import stdlib_texts

    return Haystack.from_texts(tiny_tokenizer, stdlib_texts(4), 6000, "stdlib")


def _passages(text: str) -> dict[int, str]:
    """Passage id → its text, from a template-0 prompt (``\\n\\n[id] …`` up to the next header or question)."""
    body = text.split("\n\n# passages that mention", 1)[0]
    heads = list(re.finditer(r"\n\n\[(\d+)\] ", body))
    return {
        int(m[1]): body[m.end() : (heads[i + 1].start() if i + 1 < len(heads) else len(body))]
        for i, m in enumerate(heads)
    }


def test_every_template_exact_length_answer_last_and_heldout(tiny_tokenizer, hay):
    task = get_task("rerank")
    assert task.metric == "all" and task.heldout == (4,) and 4 not in task.training_templates()
    for index in range(len(task.templates)):
        for length, depth in ((300, 0.0), (777, 0.5), (1200, 1.0)):
            s = task.generate(tiny_tokenizer, hay, length, depth, random.Random(3), template=index)
            assert len(s.ids) == length and s.answer_span == (length - len(s.answer_ids), length)
            assert tiny_tokenizer.decode(s.answer_ids).strip() == s.answer
            assert task.references(s) == s.fields["items"] and all(r in s.answer for r in task.references(s))
            # Items are delimited: no other passage's id is found in the answer by substring match.
            others = set(range(1, s.fields["passages"] + 1)) - set(s.fields["relevant"])
            tpl = task.templates[index]
            assert not [i for i in others if tpl.item.format(id=i) in s.answer]


@pytest.mark.parametrize("depth", [0.0, 0.4, 1.0])
def test_relevant_passages_mention_the_query_and_the_answer_lists_them_in_order(tiny_tokenizer, hay, depth):
    task = get_task("rerank")
    for seed in range(4):
        s = task.generate(tiny_tokenizer, hay, 1500, depth, random.Random(seed), template=0)
        passages = _passages(tiny_tokenizer.decode(s.prompt))
        n, name = s.fields["passages"], s.fields["name"]
        assert sorted(passages) == list(range(1, n + 1)) and n > 20  # as many as fit: the list fills the sample
        mentioning = [i for i, body in passages.items() if f" {name} " in body]
        assert mentioning == s.fields["relevant"] and 1 <= len(mentioning) <= 3
        assert s.answer == " ".join(f"[{i}]" for i in mentioning)
        # The first relevant passage sits at the depth within the list (clamped so the rest fit after it).
        assert mentioning[0] - 1 == min(round(depth * (n - 1)), n - len(mentioning))
        # Every distractor mentions some other name, so only the name tells them apart.
        assert all(re.search(r" [a-z]{3}_[a-z]{3} ", body) for body in passages.values())


def test_options_passages_and_relevant(tiny_tokenizer, hay):
    task = get_task("rerank")
    s = task.generate(tiny_tokenizer, hay, 600, 0.2, random.Random(1), template=0, passages=8, relevant=4)
    passages = _passages(tiny_tokenizer.decode(s.prompt))
    assert len(passages) == 8 and len(s.fields["relevant"]) == 4 == len(task.references(s))
    assert [i for i, body in passages.items() if f" {s.fields['name']} " in body] == s.fields["relevant"]
    with pytest.raises(InputError, match="relevant .5. must not exceed option passages .4."):
        task.generate(tiny_tokenizer, hay, 600, 0.2, random.Random(1), passages=4, relevant=5)


def test_too_short_length_names_it(tiny_tokenizer, hay):
    task = get_task("rerank")
    with pytest.raises(InputError, match="rerank: length 40 cannot hold"):
        task.generate(tiny_tokenizer, hay, 40, 0.5, random.Random(0))
    with pytest.raises(InputError, match="rerank: length 300 cannot hold 50 passages"):
        task.generate(tiny_tokenizer, hay, 300, 0.5, random.Random(0), passages=50)
