"""The ``mrcr`` task: a conversation filling the sample, three identical requests, the K-th one's response asked."""

from __future__ import annotations

import random
import re

import pytest

from ctxext.errors import InputError
from ctxext.tasks import Haystack, get_task
from ctxext.tasks.base import encode


@pytest.fixture(scope="module")
def hay(tiny_tokenizer):
    from tests.helpers.evaluation import stdlib_texts

    return Haystack.from_texts(tiny_tokenizer, stdlib_texts(4), 6000, "stdlib")


ROUND = re.compile(r"\nUser: write a line about (\w+)\nAssistant: (\w+ \w+)\n")


@pytest.mark.parametrize("occurrence", [1, 2, 3])
def test_mrcr_asks_the_kth_identical_request(tiny_tokenizer, hay, occurrence):
    task = get_task("mrcr")
    for depth in (0.0, 0.5, 1.0):
        s = task.generate(tiny_tokenizer, hay, 1200, depth, random.Random(3), template=0, occurrence=occurrence)
        assert len(s.ids) == 1200 and s.answer_span[1] == 1200
        text = tiny_tokenizer.decode(s.prompt)
        rounds = ROUND.findall(text)  # the conversation as built, read back from the tokens
        topic, response = s.fields["topic"], s.fields["response"]
        assert len(rounds) == s.fields["rounds"] >= 10
        # The defining property: the topic is requested exactly three times, each answered differently,
        # and the answer is the response to its `occurrence`-th request.
        asked = [r for t, r in rounds if t == topic]
        assert len(asked) == 3 and len(set(asked)) == 3
        assert asked[occurrence - 1] == response == s.answer == task.references(s)[0]
        assert len({r for _, r in rounds}) == len(rounds)  # only one round carries the answer
        assert text.endswith(f"request to write a line about {topic}\nAssistant:")
        assert s.answer_ids == encode(tiny_tokenizer, f" {response}")
        # The asked round sits at the depth within the conversation, moved only to fit the other copies.
        n, at = len(rounds), s.fields["position"]
        assert rounds[at] == (topic, response)
        assert at == min(max(round(depth * (n - 1)), occurrence - 1), n - 1 - (3 - occurrence))
        # The conversation fills the sample: no room for one more round.
        assert s.filler_tokens < len(encode(tiny_tokenizer, f"\nUser: write a line about {topic}\nAssistant: ab cd\n"))


def test_mrcr_options_templates_and_errors(tiny_tokenizer, hay):
    task = get_task("mrcr")
    assert task.heldout == (4,) and 4 not in task.training_templates()
    assert task.metric == "all" and task.options == {"occurrence": 2}
    for index in range(len(task.templates)):
        s = task.generate(tiny_tokenizer, hay, 300, 0.5, random.Random(1), template=index)
        assert len(s.ids) == 300 and s.answer in tiny_tokenizer.decode(s.answer_ids)
        assert len(s.fields["copies"]) == 3 and s.fields["copies"][1] == s.fields["position"]
    with pytest.raises(InputError, match="mrcr: length 40 cannot hold"):
        task.generate(tiny_tokenizer, hay, 40, 0.5, random.Random(0))
    with pytest.raises(InputError, match="option occurrence must be 1, 2 or 3"):
        task.generate(tiny_tokenizer, hay, 300, 0.5, random.Random(0), occurrence=4)
