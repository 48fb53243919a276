"""Chat templates around task and QA prompts: auto (by what the model is) / tokenizer / none / a Jinja file.

The answer prefix opens the assistant's turn; lengths stay exact; reports say which template was used and why.
"""

from __future__ import annotations

import copy
import random

import pytest
from typer.testing import CliRunner

from ctxext.errors import InputError
from ctxext.tasks import Haystack, get_task
from ctxext.tasks.chat import chat_format, chat_wrap
from tests.helpers.evaluation import (  # noqa: F401 — one_thread is an autouse fixture
    chatml_tokenizer,
    loaded,
    one_thread,
    save_tiny_model,
    tiny_lm,
)

# A Zephyr-like template: BOS, a user turn, an assistant header as the generation prompt.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_tokenizer(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = TEMPLATE
    return tok


def test_auto_wraps_only_tokenizers_with_a_template(tiny_tokenizer, chat_tokenizer, tmp_path):
    assert chat_wrap(tiny_tokenizer, "auto") is None  # a base model stays plain
    assert chat_wrap(chat_tokenizer, "none") is None
    wrap = chat_wrap(chat_tokenizer, "auto")
    assert wrap is not None and wrap.source == "tokenizer"
    assert wrap.head[0] == chat_tokenizer.bos_token_id and chat_tokenizer.decode(wrap.head) == "<s><|user|>\n"
    assert chat_tokenizer.decode(wrap.tail) == "</s>\n<|assistant|>\n"
    # A template file works for a tokenizer without one, and is named in the result.
    path = tmp_path / "chat.jinja"
    path.write_text(TEMPLATE.replace("<|assistant|>", "<|bot|>"))
    filed = chat_wrap(tiny_tokenizer, str(path))
    assert filed is not None and filed.source == str(path) and "<|bot|>" in tiny_tokenizer.decode(filed.tail)


def test_chat_sample_has_exact_length_and_the_answer_prefix_opens_the_assistant_turn(chat_tokenizer):
    hay = Haystack.noise(chat_tokenizer)
    wrap = chat_wrap(chat_tokenizer, "auto")
    assert wrap is not None
    task = get_task("needle")
    plain = task.generate(chat_tokenizer, hay, 300, 0.5, random.Random(0), template=3)  # RULER's prose form
    chat = task.generate(chat_tokenizer, hay, 300, 0.5, random.Random(0), template=3, chat=wrap)
    assert len(chat.ids) == len(plain.ids) == 300 and chat.answer == plain.answer
    assert chat.ids[: len(wrap.head)] == wrap.head
    name = chat.fields["name"]
    # Plain: the question and the answer prefix as one text, then the answer.
    asked = f" What is the special magic number for {name} mentioned in the provided text?"
    opening = f"The special magic number for {name} mentioned in the provided text is"
    assert chat_tokenizer.decode(plain.prompt).endswith(f"{asked} {opening}")
    # Chat: the question ends the user's turn, the assistant header follows, then the answer prefix opens its turn.
    text = chat_tokenizer.decode(chat.prompt, skip_special_tokens=False)
    assert text.endswith(f"{asked}</s>\n<|assistant|>\n{opening}"), text[-200:]
    start = chat.answer_span[0]
    opening_ids = chat_tokenizer(opening, add_special_tokens=False)["input_ids"]
    assert chat.ids[start - len(opening_ids) - len(wrap.tail) : start - len(opening_ids)] == wrap.tail
    assert chat_tokenizer.decode(chat.answer_ids) == chat_tokenizer.decode(plain.answer_ids) == f" {plain.answer}"
    assert chat.fields == plain.fields  # the same draw


def test_an_answer_without_prefix_opens_the_assistant_turn_without_a_space(chat_tokenizer):
    from ctxext.tasks import Template

    hay = Haystack.noise(chat_tokenizer)
    wrap = chat_wrap(chat_tokenizer, "auto")
    bare = Template(needle="\nKEY_{name} = {key}\n", question="\nWhat is KEY_{name}?", answer=" {key}")
    chat = get_task("needle").generate(chat_tokenizer, hay, 200, 0.5, random.Random(0), template=bare, chat=wrap)
    assert wrap is not None and chat.ids[chat.answer_span[0] - len(wrap.tail) : chat.answer_span[0]] == wrap.tail
    assert chat_tokenizer.decode(chat.answer_ids) == chat.answer  # no leading space after the header


def test_auto_decides_by_what_the_model_is(tiny_tokenizer):
    """An instruct model (its generation stops at the template's end of turn) gets its template; a base model that
    ships one, or none, gets plain prompts; tokenizer and none override; every decision says why."""
    from ctxext.tasks.chat import auto_choice, eos_ids

    instruct, base = chatml_tokenizer(tiny_tokenizer), chatml_tokenizer(tiny_tokenizer, instruct=False)
    end = instruct.convert_tokens_to_ids("<|im_end|>")
    wrap, why = chat_format(instruct, "auto")
    assert wrap is not None and wrap.source == "tokenizer" and wrap.end == [end]
    assert why == "auto: an instruct model: its generation stops at the chat template's end of turn <|im_end|>"
    assert instruct.decode(wrap.head) == "<|im_start|>user\n"
    assert instruct.decode(wrap.tail) == "<|im_end|>\n<|im_start|>assistant\n"
    wrap, why = chat_format(base, "auto")
    assert wrap is None and why.startswith("auto: a base model: its tokenizer has a chat template, but its generation")
    assert "stops at </s>" in why and "ends a turn with <|im_end|>" in why
    # Llama-3.1-Instruct's way: the tokenizer's EOS is end-of-text, the configs list the end of turn too.
    assert auto_choice(base, eos_ids(base, {"eos_token_id": [base.eos_token_id, end]}))[0] == "tokenizer"
    assert chat_format(tiny_tokenizer, "auto") == (None, "auto: a base model: its tokenizer has no chat template")
    forced, why = chat_format(base, "tokenizer")
    assert forced is not None and why == "asked for" and chat_format(instruct, "none") == (None, "asked for")
    with pytest.raises(InputError, match="has none: pass none"):
        chat_format(tiny_tokenizer, "tokenizer")


def test_every_task_template_has_an_answer_prefix_in_the_assistant_turn(tiny_tokenizer):
    """Every registered task's every template: an answer prefix that, in a chat, follows the assistant header."""
    from ctxext.tasks import task_names

    tok = chatml_tokenizer(tiny_tokenizer)
    wrap = chat_wrap(tok, "auto")
    assert wrap is not None
    hay = Haystack.noise(tok)
    for name in task_names():
        task = get_task(name)
        for index, tpl in enumerate(task.templates):
            assert tpl.answer_prefix.strip(), (name, index)
            s = task.generate(tok, hay, 900, 0.5, random.Random(index), template=index, chat=wrap)
            assert len(s.ids) == 900, (name, index)
            start = s.answer_span[0]
            head = tok.decode(s.ids[:start], skip_special_tokens=False)
            opening = head.rsplit("<|im_start|>assistant\n", 1)[1]
            literal = tpl.answer_prefix.lstrip().split("{")[0]
            assert opening.strip() and opening.startswith(literal), (name, index, opening)


def test_bad_templates_are_named(tiny_tokenizer, tmp_path):
    with pytest.raises(InputError, match="--chat-template 'nope.jinja': use auto"):
        chat_wrap(tiny_tokenizer, "nope.jinja")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(InputError, match="does not render"):
        chat_wrap(tiny_tokenizer, str(broken))
    silent = tmp_path / "silent.jinja"
    silent.write_text("no messages here")
    with pytest.raises(InputError, match="exactly once"):
        chat_wrap(tiny_tokenizer, str(silent))


def test_grid_and_qa_record_the_template(chat_tokenizer, tmp_path):
    from ctxext.evaluation.sections.grids.engine import GridSettings, evaluate_passkey
    from ctxext.evaluation.sections.qa.engine import build_qa_prompt

    lm = loaded(tiny_lm(chat_tokenizer), chat_tokenizer)
    res = evaluate_passkey(lm, GridSettings(lengths=[200], depths=[50], trials=1), show_progress=False)
    assert res["chat_template"] == "tokenizer" and res["settings"]["chat_template"] == "auto"
    plain = evaluate_passkey(lm, GridSettings(lengths=[200], depths=[50], trials=1, chat_template="none"), False)
    assert plain["chat_template"] == "none"
    wrap = chat_wrap(chat_tokenizer, "auto")
    example = {"context": "x = 1\n" * 50, "question": "what is x?", "answers": ["1"]}
    ids, info = build_qa_prompt(chat_tokenizer, example, "{context}\nQ: {question}\nA:", 120, wrap)
    assert len(ids) <= 120 and info["truncated"]
    assert wrap is not None and ids[: len(wrap.head)] == wrap.head and ids[-len(wrap.tail) :] == wrap.tail


def test_cli_names_a_missing_template_file(tiny_model_dir, tmp_path, monkeypatch):
    from ctxext.cli.commands import app

    monkeypatch.chdir(tmp_path)
    args = ["eval", "passkey", "--model", str(tiny_model_dir), "--lengths", "128", "--out", "out", "-q"]
    result = CliRunner().invoke(app, [*args, "--chat-template", "missing.jinja"])
    assert result.exit_code == 2 and "--chat-template: 'missing.jinja'" in " ".join(result.output.split())
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_a_task_that_assembles_itself_refuses_a_chat_template(chat_tokenizer):
    from ctxext.tasks import Task, Template
    from ctxext.tasks.base import assemble, encode

    class Assembled(Task):  # not registered: generate() works on the instance
        name = "assembled-test"
        templates = (Template(needle=" k 1.", question=" k:", answer=" 1"),)

        def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts):
            return assemble(
                tokenizer,
                task=self.name,
                length=length,
                depth=depth,
                rng=rng,
                haystack=haystack,
                prefix="",
                inserts=[(depth, encode(tokenizer, tpl.needle))],
                question=encode(tokenizer, tpl.question),
                answer=encode(tokenizer, tpl.answer),
                answer_text="1",
                template=index,
                fields={},
            )

    hay = Haystack.noise(chat_tokenizer)
    assert len(Assembled().generate(chat_tokenizer, hay, 100, 0.5, random.Random(0)).ids) == 100
    with pytest.raises(InputError, match="cannot be wrapped in a chat template"):
        Assembled().generate(chat_tokenizer, hay, 100, 0.5, random.Random(0), chat=chat_wrap(chat_tokenizer))


@pytest.mark.parametrize("instruct", [True, False], ids=["instruct", "base"])
def test_both_scorings_read_the_answer_after_the_prefix(tiny_tokenizer, monkeypatch, instruct):
    """Teacher-forced scoring and generation get the same prompt, ending with the answer prefix: in the assistant's
    turn for an instruct model (auto), plain for a base model that ships a template."""
    import ctxext.scoring.answers as answers
    from ctxext.evaluation.sections.grids import engine

    tok = chatml_tokenizer(tiny_tokenizer, instruct=instruct)
    seen: dict[str, list[str]] = {"teacher-forced": [], "generated": []}
    real_score, real_generate = answers.score_answers, engine.greedy_generate_ids

    def score(model, ids, spans, **kw):
        seen["teacher-forced"] += [
            tok.decode(x[: s[0]], skip_special_tokens=False) for x, s in zip(ids, spans, strict=True)
        ]
        return real_score(model, ids, spans, **kw)

    def generate(lm, prompts, n):
        seen["generated"] += [tok.decode(p, skip_special_tokens=False) for p in prompts]
        return real_generate(lm, prompts, n)

    monkeypatch.setattr(answers, "score_answers", score)
    monkeypatch.setattr(engine, "greedy_generate_ids", generate)
    lm = loaded(tiny_lm(tok), tok)
    grid = engine.GridSettings(lengths=[200], depths=[50], trials=2, scoring="both")
    res = engine.evaluate_passkey(lm, grid, show_progress=False)
    end = (
        "What is the pass key?<|im_end|>\n<|im_start|>assistant\nThe pass key is"
        if instruct
        else (" What is the pass key? The pass key is")
    )
    assert len(seen["teacher-forced"]) == len(seen["generated"]) == 2
    assert seen["teacher-forced"] == seen["generated"] and all(p.endswith(end) for p in seen["generated"])
    assert res["chat_template"] == ("tokenizer" if instruct else "none")
    assert res["chat_template_reason"].startswith("auto: an instruct model" if instruct else "auto: a base model")


def test_eval_reports_and_prints_the_template_and_why(tiny_tokenizer, tmp_path, monkeypatch):
    """``ctxext eval passkey`` on saved models: auto decides from the folder (tokenizer, config), report.json,
    report.md and the printed line say which template and why."""
    import json

    from ctxext.cli.commands import app

    monkeypatch.chdir(tmp_path)
    for kind, instruct in (("instruct", True), ("base", False)):
        model = save_tiny_model(chatml_tokenizer(tiny_tokenizer, instruct=instruct), tmp_path / kind)
        args = ["eval", "passkey", "--model", str(model), "--lengths", "200", "--depths", "50", "--trials", "1"]
        result = CliRunner().invoke(app, [*args, "--out", f"out-{kind}"])
        assert result.exit_code == 0, result.output
        section = json.loads((tmp_path / f"out-{kind}" / "report.json").read_text())["models"][0]["passkey"]
        used, why = section["chat_template"], section["chat_template_reason"]
        assert (used, why.split(":")[1].strip()) == (
            ("tokenizer", "an instruct model") if instruct else ("none", "a base model")
        )
        printed = " ".join(result.output.split())
        assert f"chat template {used} ({why})" in printed
        assert why in (tmp_path / f"out-{kind}" / "report.md").read_text()
