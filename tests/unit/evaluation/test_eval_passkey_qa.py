"""Passkey / needle prompts (exact length and depth), scoring, and QA metrics with SQuAD normalization."""

from __future__ import annotations

import json
import random

import pytest

from ctxext.errors import InputError
from ctxext.evaluation.sections.grids.engine import GridSettings, NeedleTask, evaluate_needle, evaluate_passkey
from ctxext.evaluation.sections.qa.engine import evaluate_qa, load_metric, normalize_answer, truncate_middle
from ctxext.evaluation.sections.qa.settings import QASettings
from ctxext.tasks import Haystack, get_task
from ctxext.tasks.passkey import PASSKEY_PREFIX
from tests.helpers.evaluation import (
    loaded,
    one_thread,  # noqa: F401  (autouse: one thread per test)
    tiny_lm,
)


@pytest.mark.parametrize("length", [200, 257, 1000])
@pytest.mark.parametrize("depth", [0, 10, 33, 50, 100])
def test_passkey_sample_exact_length_and_depth(tiny_tokenizer, length, depth):
    tok = tiny_tokenizer
    hay = Haystack.noise(tok)
    s = get_task("passkey").generate(tok, hay, length, depth / 100, random.Random(3), template=0)
    key = s.fields["key"]
    assert len(s.ids) == length and s.answer_span[1] == length
    head = tok(PASSKEY_PREFIX)["input_ids"]
    assert s.ids[: len(head)] == head and head[0] == tok.bos_token_id
    needle_ids = tok(f" The pass key is {key}. Remember it. {key} is the pass key.", add_special_tokens=False)[
        "input_ids"
    ]
    ((n_start, n_end),) = s.needle_spans
    assert s.ids[n_start:n_end] == needle_ids
    q = tok(" What is the pass key? The pass key is", add_special_tokens=False)["input_ids"]
    a = tok(f" {key}", add_special_tokens=False)["input_ids"]
    assert s.answer_ids == a and s.ids[s.answer_span[0] - len(q) : s.answer_span[0]] == q
    assert s.filler_tokens == length - len(head) - len(needle_ids) - len(q) - len(a)
    assert n_start == len(head) + round(depth / 100 * s.filler_tokens)
    # The filler around the needle is the haystack stream, in order, from the sample's offset.
    around = s.ids[len(head) : n_start] + s.ids[n_end : s.answer_span[0] - len(q)]
    assert around == hay.take(s.filler_tokens, s.haystack_offset)


def test_prompt_too_short_and_bad_depth(tiny_tokenizer):
    hay = Haystack.noise(tiny_tokenizer)
    with pytest.raises(InputError, match="cannot hold"):
        get_task("passkey").generate(tiny_tokenizer, hay, 10, 0.5, random.Random(0))
    with pytest.raises(InputError, match="between 0 and 1"):
        get_task("passkey").generate(tiny_tokenizer, hay, 500, 1.2, random.Random(0))
    with pytest.raises(InputError, match="outside 0–100"):
        GridSettings(lengths=[100], depths=[120]).validate()
    with pytest.raises(InputError, match="scoring"):
        GridSettings(lengths=[100], scoring="sample").validate()


def test_passkey_grid_runs_and_scores(tiny_tokenizer):
    lm = loaded(tiny_lm(tiny_tokenizer), tiny_tokenizer)
    settings = GridSettings(lengths=[180, 256], depths=[0, 100], trials=2, max_new_tokens=4)
    res = evaluate_passkey(lm, settings, show_progress=False)
    assert res["scoring"] == "teacher-forced"
    assert len(res["cells"]) == 4
    for cell in res["cells"]:
        assert cell["trials"] == 2 and len(cell["outcomes"]) == 2 and sum(cell["outcomes"]) == cell["correct"]
        assert 0 <= cell["ci_low"] <= cell["accuracy"] <= cell["ci_high"] <= 1
        assert all(ex["answer_nll"] > 0 for ex in cell["examples"])
    keys = [ex["key"] for c in res["cells"] for ex in c["examples"]]
    assert len(set(keys)) == len(keys)  # different keys per trial / cell
    again = evaluate_passkey(lm, GridSettings(lengths=[180, 256], depths=[0, 100], trials=2, max_new_tokens=4), False)
    assert [c["examples"] for c in again["cells"]] == [c["examples"] for c in res["cells"]]  # seeded
    # Generation scoring: same samples (same keys), outputs recorded, same outcomes on static RoPE.
    gen = evaluate_passkey(lm, GridSettings(**{**vars(settings), "scoring": "generate"}), False)
    assert gen["scoring"] == "generate"
    assert [ex["key"] for c in gen["cells"] for ex in c["examples"]] == keys
    assert all("output" in ex for c in gen["cells"] for ex in c["examples"])
    assert [c["outcomes"] for c in gen["cells"]] == [c["outcomes"] for c in res["cells"]]
    needle = evaluate_needle(lm, GridSettings(lengths=[150], depths=[50], trials=1), NeedleTask(), False)
    assert needle["cells"][0]["trials"] == 1 and 0 <= needle["cells"][0]["score"] <= 1
    assert needle["cells"][0]["examples"][0]["answer"] == "eat a sandwich and sit in Dolores Park on a sunny day"


def test_squad_normalization_and_metric():
    assert normalize_answer("The  Quick, brown FOX!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    metric = load_metric()
    out = metric.compute(
        predictions=["The Eiffel Tower.", "paris france", "nothing"],
        references=[["Eiffel tower"], ["Paris", "in Paris"], ["London"]],
        per_example=True,
    )
    assert out["exact_match_per_example"] == [100.0, 0.0, 0.0]
    assert out["f1_per_example"][1] == pytest.approx(100 * 2 * 0.5 * 1 / 1.5)
    assert out["exact_match"] == pytest.approx(100 / 3)


def test_truncate_middle():
    ids = list(range(10))
    assert truncate_middle(ids, 20) == (ids, False)
    assert truncate_middle(ids, 5) == ([0, 1, 7, 8, 9], True)


def test_qa_end_to_end_with_truncation(tiny_tokenizer, tmp_path):
    lm = loaded(tiny_lm(tiny_tokenizer), tiny_tokenizer)
    rows = [
        {"context": "x = 1\n" * 200 + "The answer is blue.", "question": "What colour?", "answers": ["blue"]},
        {"context": "The answer is red. " + "y = 2\n" * 30, "question": "What colour?", "answers": {"text": ["red"]}},
    ]
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    res = evaluate_qa(lm, QASettings(data=str(path), max_new_tokens=4, length_edges=[400]), show_progress=False)
    assert res["examples"] == 2 and res["truncated"] == 1
    assert set(res["by_length"]) == {"0-400", "400+"}
    assert "80-100%" in res["by_position"] and "0-20%" in res["by_position"]
    assert 0 <= res["overall"]["f1"] <= 100
    with pytest.raises(InputError, match="does not exist"):
        evaluate_qa(lm, QASettings(data=str(tmp_path / "missing.jsonl")), show_progress=False)
    with pytest.raises(InputError, match="no column"):
        evaluate_qa(lm, QASettings(data=str(path), context_field="doc"), show_progress=False)


def test_kept_position_follows_truncate_middle():
    from ctxext.evaluation.sections.qa.engine import kept_position

    for n, budget in ((10, 5), (11, 6), (9, 20), (100, 7)):
        ids = list(range(n))
        kept, _ = truncate_middle(ids, budget)
        for t in ids:
            where = kept_position(t, n, budget)
            if where is None:
                assert t not in kept
            else:
                assert kept[where] == t


def test_qa_answer_positions_from_kept_tokens(tiny_tokenizer):
    from ctxext.evaluation.sections.qa.engine import TRUNCATED_AWAY, build_qa_prompt

    filler = "value = compute(item)\n"
    template = "{context}\n\nQuestion: {question}\nAnswer:"

    def bucket(context, budget):
        ex = {"context": context, "question": "What colour?", "answers": ["blue"], "answer_start": None}
        ids, info = build_qa_prompt(tiny_tokenizer, ex, template, budget)
        assert len(ids) <= budget
        if info["answer_kept_token"] is not None:
            # The kept position points at the answer's tokens in the prompt (after the template's prefix).
            pre = len(tiny_tokenizer("", verbose=False)["input_ids"])
            at = pre + info["answer_kept_token"]
            assert "blue" in tiny_tokenizer.decode(ids[at : at + 3])
        return info

    # Answer in the middle of a long context: the truncation cuts it out.
    middle = filler * 60 + "The answer is blue.\n" + filler * 60
    info = bucket(middle, 200)
    assert info["truncated"] and info["position_bucket"] == TRUNCATED_AWAY and info["answer_kept_token"] is None
    # Answer near the end of the full context (> 80 %), inside the kept tail, where it sits at 60-80 % of
    # what the model sees: the bucket follows the kept text.
    late = filler * 200 + "The answer is blue.\n" + filler * 12
    info = bucket(late, 420)
    assert info["truncated"] and info["position_bucket"] != TRUNCATED_AWAY
    assert late.index("blue") / len(late) > 0.8
    kept_share = info["answer_kept_token"] / info["kept_tokens"]
    assert 0.6 <= kept_share < 0.8 and info["position_bucket"] == "60-80%"
    # No truncation: the kept position is the full position.
    info = bucket("The answer is blue. " + filler * 3, 400)
    assert not info["truncated"] and info["position_bucket"] == "0-20%"
    assert bucket(filler * 3, 400)["position_bucket"] == "not found"
