"""Many keys per input: the key set's layout, one pass scoring every answer, and clustered statistics."""

from __future__ import annotations

import random

import pytest

from ctxext.errors import InputError
from ctxext.scoring.answers import score_answer_sets, score_answers
from ctxext.scoring.stats import cluster_rate, paired_cluster_difference, wilson_interval
from ctxext.tasks import Haystack
from ctxext.tasks.keyset import make_json_keyset, make_keyset
from tests.helpers.tiny import tiny_model


def _haystack(tokenizer) -> Haystack:
    return Haystack.from_texts(tokenizer, ["def f(x):\n    return x + 1\n" * 40], 2000)


def test_keyset_places_each_needle_at_its_depth_and_asks_for_each(tiny_tokenizer):
    depths = [0.0, 0.25, 0.5, 0.75, 1.0]
    ks = make_keyset(tiny_tokenizer, _haystack(tiny_tokenizer), 600, depths, random.Random(3))
    assert len(ks.ids) == 600 and len(ks.spans) == 5 and sorted(ks.depths) == depths
    text = tiny_tokenizer.decode(ks.ids)
    for (start, end), key in zip(ks.spans, ks.keys, strict=True):
        assert tiny_tokenizer.decode(ks.ids[start:end]).strip() == str(key)
        assert text.count(str(key)) == 2  # once in its needle, once as its answer
    for (start, end), key in zip(ks.needle_spans, ks.keys, strict=True):
        assert str(key) in tiny_tokenizer.decode(ks.ids[start:end])
        assert ks.filler[0] <= start < end <= ks.filler[1] <= ks.spans[0][0]
    # A deeper needle is nearer its question: distances shrink with depth (questions come after all needles).
    by_depth = sorted(zip(ks.depths, ks.distances, ks.spans, strict=True))
    assert all(a[1] - a[2][0] > b[1] - b[2][0] for a, b in zip(by_depth, by_depth[1:], strict=False))
    # The same rng seed gives the same set; another gives fresh keys.
    again = make_keyset(tiny_tokenizer, _haystack(tiny_tokenizer), 600, depths, random.Random(3))
    other = make_keyset(tiny_tokenizer, _haystack(tiny_tokenizer), 600, depths, random.Random(4))
    assert again.ids == ks.ids and other.keys != ks.keys


def test_keyset_refuses_what_it_cannot_build(tiny_tokenizer):
    hay = _haystack(tiny_tokenizer)
    with pytest.raises(InputError, match="at least one depth"):
        make_keyset(tiny_tokenizer, hay, 600, [], random.Random(0))
    with pytest.raises(InputError, match="between 0 and 1"):
        make_keyset(tiny_tokenizer, hay, 600, [1.5], random.Random(0))
    with pytest.raises(InputError, match="too short"):
        make_keyset(tiny_tokenizer, hay, 20, [0.1, 0.9], random.Random(0))


def test_one_pass_scores_every_answer_as_separate_passes_do(tiny_tokenizer):
    model = tiny_model("llama", seed=2, vocab_size=len(tiny_tokenizer))
    sets = [
        make_keyset(tiny_tokenizer, _haystack(tiny_tokenizer), 300, [0.1, 0.5, 0.9], random.Random(s)) for s in range(2)
    ]
    together = score_answer_sets(model, [k.ids for k in sets], [k.spans for k in sets])
    for ks, scores in zip(sets, together, strict=True):
        alone = score_answers(model, [ks.ids] * len(ks.spans), ks.spans)
        assert [s.correct for s in scores] == [s.correct for s in alone]
        assert [s.nll for s in scores] == pytest.approx([s.nll for s in alone], rel=1e-5)
    with pytest.raises(InputError, match="no answer span"):
        score_answer_sets(model, [sets[0].ids], [[]])


def test_cluster_interval_is_wider_than_wilson_when_clusters_agree_within():
    # 10 inputs × 10 keys, each input all right or all wrong: 100 trials, but 10 independent units.
    correct = [i < 6 for i in range(10) for _ in range(10)]
    clusters = [i for i in range(10) for _ in range(10)]
    rate = cluster_rate(correct, clusters)
    low, high = wilson_interval(60, 100)
    assert rate["rate"] == pytest.approx(0.6) and rate["clusters"] == 10 and rate["trials"] == 100
    assert rate["ci_high"] - rate["ci_low"] > 1.3 * (high - low)
    # Independent trials (one per cluster): close to Wilson.
    single = cluster_rate(correct, list(range(100)))
    assert single["ci_high"] - single["ci_low"] == pytest.approx(high - low, rel=0.25)
    diff = paired_cluster_difference(correct, [False] * 100, clusters)
    assert diff["difference"] == pytest.approx(0.6) and diff["p_value"] < 0.01 and diff["ci_low"] > 0.2
    assert paired_cluster_difference(correct, correct, clusters)["p_value"] == 1.0


def test_json_keyset_asks_for_pairs_at_their_depths(tiny_tokenizer):
    ks = make_json_keyset(tiny_tokenizer, _haystack(tiny_tokenizer), 700, [0.0, 0.5, 1.0], random.Random(1))
    assert len(ks.ids) == 700 and len(ks.spans) == 3
    pairs = ks.fields["pairs"]
    assert sorted(ks.keys) == [0, round(0.5 * (pairs - 1)), pairs - 1]
    text = tiny_tokenizer.decode(ks.ids)
    for (start, end), key, value in zip(ks.spans, ks.fields["asked"], ks.fields["values"], strict=True):
        assert value in tiny_tokenizer.decode(ks.ids[start:end])
        assert text.count(key) == 2 and text.count(value) == 2  # in the object, and in its question / answer
    with pytest.raises(InputError, match="twice"):
        make_json_keyset(tiny_tokenizer, _haystack(tiny_tokenizer), 200, [0.5, 0.51], random.Random(1))


def test_keyset_in_a_chat_template_is_a_conversation(tiny_tokenizer):
    """With a chat template each question is a user turn and each answer an assistant turn opened by its prefix."""
    from ctxext.tasks.chat import chat_wrap
    from tests.helpers.evaluation import chatml_tokenizer

    tok = chatml_tokenizer(tiny_tokenizer)
    wrap = chat_wrap(tok, "auto")
    assert wrap is not None and tok.decode(wrap.turn or []) == "<|im_end|>\n<|im_start|>user\n"
    ks = make_keyset(tok, _haystack(tok), 600, [0.2, 0.8], random.Random(3), template=3, chat=wrap)
    assert len(ks.ids) == 600 and ks.ids[: len(wrap.head)] == wrap.head
    for (start, end), key, name in zip(ks.spans, ks.keys, ks.fields["names"], strict=True):
        assert tok.decode(ks.ids[start:end]) == f" {key}"
        before = tok.decode(ks.ids[:start], skip_special_tokens=False)
        asked = f"What is the special magic number for {name} mentioned in the provided text?"
        opening = f"The special magic number for {name} mentioned in the provided text is"
        assert before.endswith(f"{asked}<|im_end|>\n<|im_start|>assistant\n{opening}")
    text = tok.decode(ks.ids, skip_special_tokens=False)
    assert text.count("<|im_start|>user\n") == 2 and text.count("<|im_start|>assistant\n") == 2
    json_set = make_json_keyset(tok, _haystack(tok), 600, [0.3, 0.7], random.Random(0), template=3, chat=wrap)
    assert len(json_set.ids) == 600 and tok.decode(json_set.ids).count("Corresponding value:") == 2
