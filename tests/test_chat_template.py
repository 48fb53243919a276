"""Chat templates around task and QA prompts: auto / none / a Jinja file, exact lengths, recorded in reports."""

from __future__ import annotations

import copy
import random

import pytest
from typer.testing import CliRunner

from ctxext.errors import InputError
from ctxext.tasks import Haystack, get_task
from ctxext.tasks.chat import chat_wrap
from tests._eval_helpers import loaded, one_thread, tiny_lm  # noqa: F401 — one_thread is an autouse fixture

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


def test_chat_sample_has_exact_length_and_the_answer_opens_the_assistant_turn(chat_tokenizer):
    hay = Haystack.noise(chat_tokenizer)
    wrap = chat_wrap(chat_tokenizer, "auto")
    assert wrap is not None
    task = get_task("needle")
    plain = task.generate(chat_tokenizer, hay, 300, 0.5, random.Random(0), template=0)
    chat = task.generate(chat_tokenizer, hay, 300, 0.5, random.Random(0), template=0, chat=wrap)
    assert len(chat.ids) == len(plain.ids) == 300 and chat.answer == plain.answer
    assert chat.ids[: len(wrap.head)] == wrap.head
    start = chat.answer_span[0]
    assert chat.ids[start - len(wrap.tail) : start] == wrap.tail  # the assistant header right before the answer
    assert chat_tokenizer.decode(chat.answer_ids) == plain.answer  # no leading space after the header
    assert chat_tokenizer.decode(plain.answer_ids) == " " + plain.answer
    assert chat.fields == plain.fields  # the same draw


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
