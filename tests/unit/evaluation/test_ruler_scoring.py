"""Generated answers scored by RULER's string match beside teacher-forced scoring, named effective lengths."""

from __future__ import annotations

import random

import pytest
import torch

from ctxext.errors import InputError
from ctxext.evaluation.sections.ruler.engine import effective_length, named_effective_lengths
from ctxext.models.builtin import GROWN_DIR
from ctxext.tasks import Haystack, get_task
from tests.helpers.evaluation import loaded, one_thread, tiny_lm  # noqa: F401 — one_thread is an autouse fixture


def test_task_references_are_the_items_a_generated_answer_must_name(tiny_tokenizer):
    hay = Haystack.noise(tiny_tokenizer)
    needle = get_task("needle").generate(tiny_tokenizer, hay, 300, 0.5, random.Random(1), template=0)
    assert get_task("needle").references(needle) == [str(needle.fields["key"])]
    mv = get_task("multivalue").generate(tiny_tokenizer, hay, 600, 0.5, random.Random(2), values=3)
    assert get_task("multivalue").references(mv) == [str(k) for k in mv.fields["keys"]] and len(mv.fields["keys"]) == 3
    mq = get_task("multiquery").generate(tiny_tokenizer, hay, 600, 0.5, random.Random(3), queries=2)
    assert get_task("multiquery").references(mq) == [str(k) for k in mq.fields["keys"]]
    cw = get_task("common_words").generate(tiny_tokenizer, hay, 800, 0.5, random.Random(4), top=3)
    assert get_task("common_words").references(cw) == cw.fields["common"]
    assert all(get_task(t).metric in ("all", "part") for t in ("needle", "multivalue", "common_words"))


def test_named_effective_lengths_ruler_and_nolima():
    # A model at 60 % at its original length: RULER's absolute 85.6 is never reached, NoLiMa's 85 % of 60 is.
    scores = {64: 0.6, 128: 0.55, 256: 0.3}
    named = named_effective_lengths(scores, 64, min_reference=0.25)
    assert named["ruler"]["name"] == "RULER (≥ 85.6)" and named["ruler"]["length"] is None
    assert named["ruler"]["threshold"] == pytest.approx(0.856)
    assert named["nolima"]["name"] == "NoLiMa (≥ 85 % of score at short context)"
    assert named["nolima"]["length"] == 128 and named["nolima"]["threshold"] == pytest.approx(0.51)
    strong = named_effective_lengths({64: 1.0, 128: 0.9, 256: 0.86}, 64, 0.25)
    assert strong["ruler"]["length"] == 256 and strong["nolima"]["length"] == 256
    assert effective_length({64: 1.0, 128: 0.855}, 64, 0.856, "absolute")["length"] == 64  # 85.5 < 85.6


def test_grid_both_scorings_on_the_same_trials(tiny_tokenizer):
    from ctxext.evaluation.sections.grids.engine import GridSettings, evaluate_passkey

    lm = loaded(tiny_lm(tiny_tokenizer), tiny_tokenizer)
    tf = evaluate_passkey(lm, GridSettings(lengths=[180], depths=[0, 100], trials=2), show_progress=False)
    both = evaluate_passkey(lm, GridSettings(lengths=[180], depths=[0, 100], trials=2, scoring="both"), False)
    assert both["scoring"] == "both" and both["chat_template"] == "none"  # the tiny tokenizer has no template
    assert [c["outcomes"] for c in both["cells"]] == [c["outcomes"] for c in tf["cells"]]  # primary: teacher-forced
    assert [ex["key"] for c in both["cells"] for ex in c["examples"]] == [
        ex["key"] for c in tf["cells"] for ex in c["examples"]
    ]
    for cell in both["cells"]:
        assert cell["teacher_forced"]["correct"] == cell["correct"] and cell["teacher_forced"]["trials"] == 2
        gen = cell["generated"]
        assert gen["metric"] == "string_match_all" and len(gen["scores"]) == 2
        assert gen["score"] == pytest.approx(sum(gen["scores"]) / 2)
        for ex in cell["examples"]:  # the recorded output, matched again by hand
            assert ex["string_match"] == float(str(ex["key"]) in ex["output"].strip().lower())
            assert "answer_nll" in ex
    assert both["overall"]["generated"]["trials"] == 4 and "teacher_forced" in both["by_length"]["180"]
    assert "teacher_forced" in tf["cells"][0] and "generated" not in tf["cells"][0]  # only what ran


@pytest.mark.skipif(not (GROWN_DIR / "model.safetensors").is_file(), reason="the grown model is not packaged")
def test_generated_string_match_agrees_with_teacher_forcing_on_the_grown_model(cache_root):
    """Static RoPE: greedy generation starts with the answer iff teacher forcing says so; string match then finds it."""
    from ctxext.evaluation.sections.grids.engine import GridSettings, NeedleTask, evaluate_needle
    from ctxext.models.load import ModelSpec, load_model

    torch.set_num_threads(1)
    lm = load_model(ModelSpec("builtin:grown-code-64"))
    task = NeedleTask(needle="\nKEY_{name} = {key}\n", question="\nassert KEY_{name} ==", answer="{key}")
    grid = GridSettings(lengths=[64], depths=[10, 50, 90], trials=6, scoring="both")
    res = evaluate_needle(lm, grid, task, show_progress=False)
    tf = sum(c["teacher_forced"]["correct"] for c in res["cells"])
    assert tf >= 15  # the grown model retrieves in-window
    for cell in res["cells"]:
        for outcome, score in zip(cell["outcomes"], cell["generated"]["scores"], strict=True):
            assert not outcome or score == 1.0  # generated tokens start with the key: the key is in the text
    assert res["overall"]["generated"]["score"] >= tf / 18


def test_ruler_section_reports_both_scorings_and_named_lengths(tiny_model_dir, tmp_path):
    from ctxext.artifacts.report import parse_report
    from ctxext.evaluation.suite import load_suite, run_suite
    from ctxext.models.load import ModelSpec

    path = tmp_path / "r.yaml"
    path.write_text(
        "name: r\nruler:\n  lengths: [200]\n  depths: [50]\n  trials: 2\n  templates: [0]\n  scoring: both\n"
        "  threshold_reference: absolute\n  answer_margin: 2\n  tasks:\n    - {task: needle}\n"
        "    - {task: multivalue, options: {values: 2}}\n"
    )
    suite, _ = load_suite(path)
    out = tmp_path / "out"
    rep = run_suite(suite, [ModelSpec(str(tiny_model_dir), name="tiny")], out, str(path), show_progress=False)
    r = rep["models"][0]["ruler"]
    assert r["settings"]["lengths"] == [200, 256]  # the original length is always evaluated (NoLiMa's reference)
    assert set(r["scores_by"]) == {"teacher_forced", "generated"} and set(r["scores_by"]["generated"]) == {
        "needle",
        "multivalue",
    }
    mv = r["tasks"]["multivalue"]
    assert mv["by_length"]["200"]["generated"]["metric"] == "string_match_all"
    assert set(mv["effective_lengths"]) == {"teacher_forced", "generated"}
    assert set(mv["effective_lengths"]["generated"]) == {"ruler", "nolima"}
    assert set(r["effective_lengths"]["teacher_forced"]) == {"ruler", "nolima"}
    assert r["chat_template"] == "none"
    typed = parse_report(rep)
    assert typed.models[0].ruler.tasks["needle"].effective_lengths["generated"]["ruler"].name == "RULER (≥ 85.6)"
    assert typed.models[0].ruler.tasks["needle"].cells[0].generated.trials == 2
    md = (out / "report.md").read_text()
    assert "RULER (≥ 85.6)" in md and "NoLiMa (≥ 85 % of score at short context)" in md
    assert "generated, RULER string match" in md and "Chat template: none (plain prompts)" in md


def test_old_reports_without_the_new_fields_still_read(tiny_model_dir, tmp_path):
    from ctxext.artifacts.report import parse_report
    from ctxext.evaluation.report import render_markdown

    cell = {"length": 64, "depth": 50, "trials": 1, "correct": 1, "accuracy": 1.0, "outcomes": [1]}
    grid = {"task": "passkey", "scoring": "teacher-forced", "cells": [cell]}
    rope = {"rope_type": "default", "rope_theta": 1e4, "original_length": 64, "current_length": 64}
    old = {"schema": "ctxext.eval.report/v1", "models": [{"name": "m", "rope": rope, "passkey": grid}]}
    typed = parse_report(old)
    assert typed.models[0].passkey.cells[0].generated is None and typed.models[0].passkey.chat_template is None
    assert "Chat template" not in render_markdown(typed)


def test_bad_generation_settings():
    from ctxext.evaluation.sections.grids.engine import GridSettings

    with pytest.raises(InputError, match="teacher-forced, generate, both"):
        GridSettings(lengths=[10], scoring="sample").validate()
    with pytest.raises(InputError, match="answer_margin"):
        GridSettings(lengths=[10], answer_margin=-1).validate()
