"""The synthetic task registry: exact lengths, answers last, needles where they belong, clear errors."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter

import pytest

from ctxext.errors import InputError
from ctxext.tasks import Haystack, Task, Template, get_task, register_task, task_names
from ctxext.tasks.base import encode

ALL = [
    "passkey",
    "needle",
    "multikey",
    "multivalue",
    "multiquery",
    "variable_tracking",
    "common_words",
    "copy_span",
    "json_kv",
    "doc_qa",
    "icl",
    "rerank",
    "mrcr",
]


@pytest.fixture(scope="module")
def hay(tiny_tokenizer):
    from tests.helpers.evaluation import stdlib_texts

    return Haystack.from_texts(tiny_tokenizer, stdlib_texts(4), 6000, "stdlib")


def test_registry_lists_every_task_and_imports_no_torch():
    assert set(ALL) <= set(task_names())
    # Training's data preparation and `ctxext validate` use the registry without loading a model.
    code = "import sys, ctxext.tasks as t; t.task_names(); assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", ALL)
def test_every_template_exact_length_and_answer_last(tiny_tokenizer, hay, name):
    task = get_task(name)
    haystack = Haystack.noise(tiny_tokenizer) if task.haystack == "noise" else hay
    assert task.heldout and set(task.heldout).isdisjoint(task.training_templates())
    for index in range(len(task.templates)):
        for length, depth in ((400, 0.0), (511, 0.5), (900, 1.0)):
            s = task.generate(tiny_tokenizer, haystack, length, depth, random.Random(7), template=index)
            assert len(s.ids) == length and s.answer_span == (length - len(s.answer_ids), length)
            assert s.template == index and s.answer_ids
            if name != "copy_span":
                # The answer ids are the tokenization of the answer text as the template writes it.
                assert s.answer in tiny_tokenizer.decode(s.answer_ids)
            for a, b in s.needle_spans:
                assert 0 < a < b <= s.answer_span[0]
            again = task.generate(tiny_tokenizer, haystack, length, depth, random.Random(7), template=index)
            assert again.ids == s.ids  # the rng is the only randomness


def test_single_needle_depth_and_content(tiny_tokenizer, hay):
    tok = tiny_tokenizer
    for depth in (0.0, 0.3, 1.0):
        s = get_task("needle").generate(tok, hay, 300, depth, random.Random(1), template=0)
        ((a, b),) = s.needle_spans
        head = len(tok("")["input_ids"])
        assert a == head + round(depth * s.filler_tokens)
        name, key = s.fields["name"], s.fields["key"]
        assert s.ids[a:b] == encode(tok, f"\nKEY_{name} = {key}\n")
        assert s.answer == str(key) and s.answer_ids == encode(tok, f" {key}")


def test_multikey_distractors(tiny_tokenizer, hay):
    s = get_task("multikey").generate(tiny_tokenizer, hay, 600, 0.5, random.Random(2), distractors=5)
    assert len(s.needle_spans) == 6 and len(s.fields["distractors"]) == 5
    assert s.fields["name"] not in s.fields["distractors"]
    assert s.fields["key"] not in s.fields["distractors"].values()
    text = tiny_tokenizer.decode(s.prompt)
    for name, key in s.fields["distractors"].items():
        assert f"KEY_{name} = {key}" in text
    assert text.endswith(f"assert KEY_{s.fields['name']} ==")


def test_multivalue_answer_in_document_order(tiny_tokenizer, hay):
    s = get_task("multivalue").generate(tiny_tokenizer, hay, 700, 0.8, random.Random(3), values=5)
    keys = s.fields["keys"]
    text = tiny_tokenizer.decode(s.prompt)
    positions = [text.index(f".append({k})") for k in keys]
    assert positions == sorted(positions)
    assert s.answer == ", ".join(map(str, keys))


def test_multiquery_and_variable_tracking(tiny_tokenizer, hay):
    s = get_task("multiquery").generate(tiny_tokenizer, hay, 600, 0.2, random.Random(4), queries=3)
    assert s.answer == ", ".join(map(str, s.fields["keys"]))
    assert ", ".join(f"KEY_{n}" for n in s.fields["names"]) in tiny_tokenizer.decode(s.prompt)
    v = get_task("variable_tracking").generate(tiny_tokenizer, hay, 600, 0.1, random.Random(5), hops=3, distractors=1)
    chain = v.fields["chain"]
    text = tiny_tokenizer.decode(v.prompt)
    steps = [f"X_{chain[0]} = {v.fields['key']}"] + [f"X_{chain[i]} = X_{chain[i - 1]}" for i in range(1, 4)]
    assert [text.index(x) for x in steps] == sorted(text.index(x) for x in steps)
    assert text.endswith(f"assert X_{chain[-1]} ==") and v.answer == str(v.fields["key"])
    assert len(v.needle_spans) == 8  # two chains of four assignments


def test_common_words_counts(tiny_tokenizer, hay):
    s = get_task("common_words").generate(tiny_tokenizer, hay, 800, 0.5, random.Random(6), top=3)
    ((a, b),) = s.needle_spans
    listing = tiny_tokenizer.decode(s.ids[a:b]).split("words = [", 1)[1]
    counts = Counter(w.strip(" '") for w in listing.split(","))
    top = [w for w, _ in counts.most_common(3)]
    assert top == s.fields["common"]
    assert [counts[w] for w in top] == s.fields["counts"]
    assert len({counts[w] for w in top}) == 3 and max(c for w, c in counts.items() if w not in top) == 1
    assert s.answer == ", ".join(f"'{w}'" for w in top)


def test_copy_span_answer_is_the_marked_span(tiny_tokenizer, hay):
    s = get_task("copy_span").generate(tiny_tokenizer, hay, 500, 0.4, random.Random(8), span=12)
    ((a, b),) = s.needle_spans
    assert len(s.answer_ids) == 12
    inner = s.ids[a:b]
    assert any(inner[i : i + 12] == s.answer_ids for i in range(len(inner) - 11))


def test_custom_template_and_errors(tiny_tokenizer, hay):
    tok = tiny_tokenizer
    custom = Template(needle=" The cat is asleep. ", question=" Where is the cat? The cat is", answer=" asleep")
    s = get_task("needle").generate(tok, hay, 200, 0.5, random.Random(0), template=custom)
    assert s.template is None and s.answer == "asleep" and s.fields == {}
    with pytest.raises(InputError, match="task multikey: length 40 cannot hold"):
        get_task("multikey").generate(tok, hay, 40, 0.5, random.Random(0), distractors=3)
    with pytest.raises(InputError, match="unknown task 'nope'; tasks: "):
        get_task("nope")
    with pytest.raises(InputError, match="unknown option.*distractor.*its options: distractors"):
        get_task("multikey").generate(tok, hay, 400, 0.5, random.Random(0), distractor=3)
    with pytest.raises(InputError, match="non-negative integer"):
        get_task("multikey").generate(tok, hay, 400, 0.5, random.Random(0), distractors=-1)
    with pytest.raises(InputError, match="templates 0–4; template 9"):
        get_task("needle").generate(tok, hay, 400, 0.5, random.Random(0), template=9)
    with pytest.raises(InputError, match="depth 1.5"):
        get_task("needle").generate(tok, hay, 400, 1.5, random.Random(0))
    with pytest.raises(InputError, match="has a field this task does not provide"):
        get_task("needle").generate(tok, hay, 400, 0.5, random.Random(0), template=Template("{key} {oops}", "?", "x"))
    with pytest.raises(InputError, match="common_words: length 60"):
        get_task("common_words").generate(tok, hay, 60, 0.5, random.Random(0), top=3)
    with pytest.raises(InputError, match="empty"):
        Haystack([], "empty")


def test_register_a_task(tiny_tokenizer, hay):
    from ctxext.tasks.needle import single_needle
    from ctxext.tasks.registry import TASKS

    @register_task
    class Echo(Task):
        name = "echo-test"
        description = "test task"
        templates = (Template(needle=" code {key}.", question=" code:", answer=" {key}"),)

        def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts):
            return single_needle(self, tokenizer, haystack, length, depth, rng, tpl, index)

    try:
        s = get_task("echo-test").generate(tiny_tokenizer, hay, 100, 0.5, random.Random(0))
        assert len(s.ids) == 100 and s.answer == str(s.fields["key"])
        with pytest.raises(ValueError, match="registered twice"):

            @register_task
            class Other(Echo):
                pass
    finally:
        TASKS.pop("echo-test", None)


def test_json_kv_is_a_json_object_and_asks_the_pair_at_the_depth(tiny_tokenizer, hay):
    import json
    import re

    task = get_task("json_kv")
    uuid = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    for depth in (0.0, 0.5, 1.0):
        s = task.generate(tiny_tokenizer, hay, 1200, depth, random.Random(11), template=3)  # HELMET's prompt
        text = tiny_tokenizer.decode(s.ids[: s.answer_span[0]])
        body = text[text.index("JSON data:\n") + len("JSON data:\n") : text.index("}\n\nKey:") + 1]
        obj = json.loads(body)  # a real JSON object
        keys = list(obj)
        assert len(keys) == s.fields["pairs"] >= 5 and all(uuid.match(k) and uuid.match(v) for k, v in obj.items())
        assert keys.index(s.fields["key"]) == s.fields["position"] == round(depth * (len(keys) - 1))
        assert obj[s.fields["key"]] == s.fields["value"] and task.references(s) == [s.fields["value"]]
        assert text.endswith(f'Key: "{s.fields["key"]}"\nCorresponding value:')
        one_more = encode(tiny_tokenizer, f', "{s.fields["key"]}": "{s.fields["value"]}"')
        assert s.filler_tokens < len(one_more)  # the object fills the sample: no room for one more pair
    short = task.generate(tiny_tokenizer, hay, 300, 0.5, random.Random(0), template=0, hex=6)
    assert len(short.fields["key"]) == 6 and short.fields["pairs"] > 5
    with pytest.raises(InputError, match="json_kv: length 30 cannot hold"):
        task.generate(tiny_tokenizer, hay, 30, 0.5, random.Random(0))


def test_doc_qa_documents_headers_and_the_defining_file(tiny_tokenizer, hay):
    task = get_task("doc_qa")
    assert task.metric == "part"
    for depth in (0.0, 0.45, 1.0):
        s = task.generate(tiny_tokenizer, hay, 1500, depth, random.Random(5), template=0, docs=6)
        text = tiny_tokenizer.decode(s.ids[: s.answer_span[0]])
        paths = [text[m + len("\n# file: ") :].split("\n", 1)[0] for m in _find_all(text, "\n# file: ")]
        assert len(paths) == len(set(paths)) == 6
        target = s.fields["document"]
        assert target == min(5, int(depth * 6)) and paths[target] == s.fields["path"] == task.references(s)[0]
        # The asked name is defined once, inside the target document (after its header, before the next).
        func = s.fields["func"]
        where = text.index(f"\ndef {func}(*args):")
        assert text.count(f"def {func}(") == 1
        starts = [m for m in _find_all(text, "\n# file: ")]
        assert starts[target] < where and (target == 5 or where < starts[target + 1])
        assert text.count("(*args):\n    return None") == 6  # one definition per document: 5 distractors
        assert text.endswith(f"# Q: which file defines {func}? A: the file")
    with pytest.raises(InputError, match="doc_qa: length 60 cannot hold"):
        task.generate(tiny_tokenizer, hay, 60, 0.5, random.Random(0))


def _find_all(text: str, needle: str) -> list[int]:
    out, at = [], text.find(needle)
    while at >= 0:
        out.append(at)
        at = text.find(needle, at + 1)
    return out


def test_new_tasks_fit_a_chat_template_and_train_in_a_mixture(tiny_tokenizer, hay):
    import copy
    from types import SimpleNamespace

    import yaml

    from ctxext.recipe.schema import parse_recipe
    from ctxext.tasks.chat import chat_wrap
    from ctxext.training.data.mixture import prepare_training_data

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
    wrap = chat_wrap(tok, "auto")
    for name in ("json_kv", "common_words", "doc_qa"):  # tasks that fill the length leave the template room
        s = get_task(name).generate(tok, hay, 700, 0.5, random.Random(1), template=0, chat=wrap)
        assert len(s.ids) == 700
    # 2048 tokens: a JSON object's closing and the question take 80–140 tokens after the asked pair (by template), more
    # than the last eighth of a shorter span, which the distance rule (data.task_distance: uniform) must reach.
    recipe = yaml.safe_load(
        "model: {path: x}\nrope: {method: yarn, target_length: 2048}\ntrain: {max_steps: 1, seq_len: 2048}\n"
        "data:\n  num_proc: 1\n  mixture:\n    - {task: json_kv, weight: 1, min_length: 2048}\n"
        "    - {task: doc_qa, weight: 1, min_length: 2048}\n"
        "    - {path: builtin:stdlib, weight: 0, max_documents: 12}\n"
    )
    plan = SimpleNamespace(original_length=256, target_length=2048)
    data = prepare_training_data(parse_recipe(recipe), tiny_tokenizer, plan, rows=4)
    realised = {r["source"]: r for r in data.mixture["realised"]["sources"]}
    assert realised["task:json_kv"]["rows"] == 2 and realised["task:doc_qa"]["rows"] == 2
