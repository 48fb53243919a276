"""The ``icl`` task: many-shot in-context classification whose query's label only the examples determine."""

from __future__ import annotations

import random
import re
from collections import defaultdict

import pytest

from ctxext.errors import InputError
from ctxext.tasks import Haystack, get_task
from ctxext.tasks.base import encode


@pytest.fixture(scope="module")
def hay(tiny_tokenizer):
    from tests.helpers.evaluation import stdlib_texts

    return Haystack.from_texts(tiny_tokenizer, stdlib_texts(4), 6000, "stdlib")


def _examples(text: str) -> list[tuple[str, str]]:
    """The ``(input, label)`` pairs of template 0 in a decoded prompt, in order."""
    return re.findall(r"^([a-z]{3} [a-z]{3} [a-z]{3}) -> ([a-z]{3})$", text, flags=re.M)


def test_every_template_exact_length_answer_last_and_heldout(tiny_tokenizer, hay):
    task = get_task("icl")
    assert task.metric == "part" and task.options == {"labels": 6}
    assert task.heldout == (4,) and 4 not in task.training_templates()
    for index in range(len(task.templates)):
        for length, depth in ((300, 0.0), (511, 0.5), (900, 1.0)):
            s = task.generate(tiny_tokenizer, hay, length, depth, random.Random(3), template=index)
            assert len(s.ids) == length and s.answer_span == (length - len(s.answer_ids), length)
            assert s.fields["label"] in tiny_tokenizer.decode(s.answer_ids)
            assert task.references(s) == [s.fields["label"]] and s.fields["examples"] >= 5


@pytest.mark.parametrize("labels", [2, 6, 8])
def test_the_query_label_is_given_only_by_the_example_at_the_depth(tiny_tokenizer, hay, labels):
    task = get_task("icl")
    for depth in (0.0, 0.3, 1.0):
        s = task.generate(tiny_tokenizer, hay, 1200, depth, random.Random(9), template=0, labels=labels)
        text = tiny_tokenizer.decode(s.ids[: s.answer_span[0]])
        examples = _examples(text)
        assert len(examples) == s.fields["examples"]
        # The examples define a consistent keyword → label map over exactly `labels` made-up labels.
        seen: dict[str, set[str]] = defaultdict(set)
        for inp, label in examples:
            for word in inp.split():
                seen[word].add(label)
        assert {lab for _, lab in examples} <= set(s.fields["labels"]) and len(s.fields["labels"]) == labels
        keyword, query = s.fields["keyword"], s.fields["query"]
        # The query's keyword is in exactly one example: the one at the depth, labelled with the answer.
        holders = [i for i, (inp, _) in enumerate(examples) if keyword in inp.split()]
        assert holders == [s.fields["position"]] == [round(depth * (len(examples) - 1))]
        assert examples[holders[0]][1] == s.fields["label"] and examples[holders[0]][0] != query
        # Every other keyword recurs under one label; the query's filler words are noise (several labels).
        keywords = {w for w, labs in seen.items() if len(labs) == 1 and sum(w in i.split() for i, _ in examples) > 2}
        assert keywords and all(len(seen[w]) > 1 for w in query.split() if w != keyword)
        assert text.endswith(f"\n{query} ->") and s.answer == s.fields["label"]
        # The examples fill the sample: the spare tokens are fewer than a long example needs.
        longest = max(len(encode(tiny_tokenizer, f"\n{inp} -> {label}")) for inp, label in examples)
        assert s.filler_tokens < longest


def test_labels_differ_between_samples_and_errors(tiny_tokenizer, hay):
    task = get_task("icl")
    a = task.generate(tiny_tokenizer, hay, 400, 0.5, random.Random(1))
    b = task.generate(tiny_tokenizer, hay, 400, 0.5, random.Random(2))
    assert a.fields["labels"] != b.fields["labels"]  # drawn per sample: nothing to know from pretraining
    with pytest.raises(InputError, match="icl: length 12 cannot hold"):
        task.generate(tiny_tokenizer, hay, 12, 0.5, random.Random(0))
    with pytest.raises(InputError, match="option labels must be at least 2"):
        task.generate(tiny_tokenizer, hay, 400, 0.5, random.Random(0), labels=1)
