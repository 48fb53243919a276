"""``ctxext tasks export``: prompts in the chat template auto picks, ending with the answer prefix; one generation
budget and stop rule for every document, whatever its answer's length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.evaluation.export_tasks import read_task_config
from tests.helpers.evaluation import chatml_tokenizer, save_tiny_model

runner = CliRunner()
PASSKEY = ["--tasks", "passkey", "--lengths", "200", "--depths", "50", "--trials", "2", "--templates", "0"]


def export(model: Path, out: Path, *args: str) -> tuple[list[dict], dict, dict, str]:
    """Run the export; the documents, task YAML and manifest of its one task, and what it printed."""
    result = runner.invoke(app, ["tasks", "export", str(out), "--model", str(model), *args])
    assert result.exit_code == 0, result.output
    [data] = sorted(out.glob("*.jsonl"))
    docs = [json.loads(line) for line in data.read_text().splitlines()]
    config = read_task_config(data.with_suffix(".yaml"))
    manifest = json.loads((out / "ctxext-tasks.json").read_text())
    return docs, config, manifest, " ".join(result.output.split())


@pytest.fixture(scope="module")
def chat_models(tiny_tokenizer, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat-models")
    return {
        kind: save_tiny_model(chatml_tokenizer(tiny_tokenizer, instruct=kind == "instruct"), root / kind)
        for kind in ("instruct", "base")
    }


def test_exported_prompts_end_with_the_answer_prefix_in_the_chosen_template(chat_models, tmp_path):
    from ctxext.evaluation.sections.grids.engine import text_haystack
    from ctxext.models.load import load_tokenizer_and_config
    from ctxext.tasks.chat import chat_wrap
    from ctxext.tasks.samples import make_samples

    # An instruct model: auto puts the question in the user's turn and the answer prefix in the assistant's.
    docs, config, manifest, printed = export(chat_models["instruct"], tmp_path / "instruct", *PASSKEY)
    end = "What is the pass key?<|im_end|>\n<|im_start|>assistant\nThe pass key is"
    assert len(docs) == 2 and all(d["prompt"].endswith(end) for d in docs)
    assert all(d["prompt"].startswith("<|im_start|>user\n") for d in docs)
    assert manifest["chat_template"] == "tokenizer" and manifest["settings"]["chat_template"] == "auto"
    why = manifest["chat_template_reason"]
    assert why.startswith("auto: an instruct model") and f"chat template: tokenizer ({why})" in printed
    assert config["generation_kwargs"]["until"] == [".", "\n", "<|im_end|>"]  # the key's "." and the end of turn
    # They are the grid's samples, in the same wrap.
    tok, _ = load_tokenizer_and_config(str(chat_models["instruct"]))
    hay = text_haystack(tok, "builtin:stdlib", "text", "test", 400)
    wrap = chat_wrap(tok, "tokenizer")
    samples = make_samples(tok, "passkey", hay, 200, 50, trials=2, seed=0, template=[0], chat=wrap)
    assert [d["prompt"] for d in docs] == [tok.decode(s.prompt, skip_special_tokens=False) for s in samples]

    # Asked for none, or a base model that ships a template: plain prompts, question and prefix as one text.
    for model, choice, reason in (("instruct", ["--chat-template", "none"], "asked for"), ("base", [], "auto: a base")):
        docs, config, manifest, _ = export(chat_models[model], tmp_path / f"{model}-plain", *PASSKEY, *choice)
        assert all(d["prompt"].endswith(" What is the pass key? The pass key is") for d in docs)
        assert "<|im_start|>" not in docs[0]["prompt"] and all(d["tokens_match"] for d in docs)
        assert manifest["chat_template"] == "none" and manifest["chat_template_reason"].startswith(reason)
        assert config["generation_kwargs"]["until"] == [".", "\n"]


def test_every_document_gets_the_same_margin_and_stop_whatever_its_answer_length(tiny_model_dir, tmp_path):
    """ICL labels are 2–4 tokens: every document may generate the margin beyond its own answer and stops at the
    template's terminator, so trailing text fails the shortest answer and the longest alike."""
    from transformers import AutoTokenizer

    from ctxext.scoring.exact_match import answer_matches

    args = ["--tasks", "icl", "--lengths", "250", "--depths", "50", "--trials", "8", "--templates", "4"]
    docs, config, manifest, _ = export(tiny_model_dir, tmp_path / "icl", *args)
    gen = config["generation_kwargs"]
    budget, until = gen["max_gen_toks"], gen["until"]
    lengths = [d["answer_tokens"] for d in docs]
    assert len(set(lengths)) > 1, lengths  # mixed answer lengths: the case at issue
    assert until == ["\n"] and all(budget - n >= 8 for n in lengths)  # the default margin beyond every answer
    assert manifest["tasks"][0]["margin"] == 8 and manifest["tasks"][0]["max_gen_toks"] == budget

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    def outcome(doc: dict, continuation: str) -> bool:
        # What lm-eval scores: greedy text of at most max_gen_toks tokens, cut at the stops, then exact match.
        ids = tok(f" {doc['answer']}{continuation}", add_special_tokens=False)["input_ids"][:budget]
        return answer_matches(tok.decode(ids), doc["answer"], until)

    assert all(outcome(d, "\n# next => xyz") for d in docs)  # the answer, then the form's terminator
    assert not any(outcome(d, " and then some more words") for d in docs)  # trailing text fails every length
    # With the longest answer as the budget (the old rule) the longest answer's trailing text was cut off unseen.
    longest = max(docs, key=lambda d: d["answer_tokens"])
    ids = tok(f" {longest['answer']} and then", add_special_tokens=False)["input_ids"][: longest["answer_tokens"]]
    assert answer_matches(tok.decode(ids), longest["answer"], until)

    docs, config, _, printed = export(tiny_model_dir, tmp_path / "icl-3", *args, "--answer-margin", "3")
    assert all(config["generation_kwargs"]["max_gen_toks"] - d["answer_tokens"] >= 3 for d in docs)
    assert "(≥ 3 beyond every answer)" in printed


def test_a_stop_inside_an_answer_is_left_out(tiny_tokenizer):
    from ctxext.evaluation.export_tasks import stop_sequences
    from ctxext.tasks import get_task

    passkey = get_task("passkey")
    assert stop_sequences(passkey, [0], ["12345"], tiny_tokenizer, None) == [".", "\n"]
    assert stop_sequences(passkey, [0], ["12345", "3.14"], tiny_tokenizer, None) == ["\n"]
