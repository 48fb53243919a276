"""The no-needle control of a retrieval grid: the same prompts without their evidence, scored the same way.

On the grown multi-key model (64-token window): a keyed needle is retrieved with it and never without it (a
fresh 5-digit key cannot be guessed); a needle whose answer the question itself gives away scores as high
without the needle — the leak the control exists to show.
"""

from __future__ import annotations

import pytest

from ctxext.models.builtin import GROWN_MK_DIR

pytestmark = pytest.mark.skipif(
    not (GROWN_MK_DIR / "model.safetensors").is_file(), reason="the multi-key grown model is not packaged"
)


@pytest.fixture(scope="module")
def grown():
    from ctxext.models.load import ModelSpec, load_model

    return load_model(ModelSpec("builtin:grown-code-64-mk"), device="cpu")


@pytest.fixture(scope="module")
def haystack(grown):
    from ctxext.evaluation.sections.grids.engine import load_haystack

    return load_haystack(grown, "builtin:stdlib", "text", "test", 512)


def test_control_sample_keeps_length_question_and_answer_and_drops_the_inserts(grown, haystack):
    from ctxext.evaluation.control import control_sample
    from ctxext.evaluation.sections.grids.engine import GridSettings
    from ctxext.tasks.samples import make_samples

    settings = GridSettings(lengths=[64], depths=[50], trials=4)
    for task, opts in (("needle", {}), ("multikey", {"distractors": 2})):
        for s in make_samples(
            grown.tokenizer, task, haystack, 64, 50.0, trials=settings.trials, seed=settings.seed, options=opts
        ):
            c = control_sample(s, haystack)
            assert len(c.ids) == len(s.ids) == 64 and c.answer_span == s.answer_span
            assert c.ids[s.answer_span[0] - 3 :] == s.ids[s.answer_span[0] - 3 :]  # question end and answer
            outside = [i for i in range(64) if not any(a <= i < b for a, b in s.needle_spans)]
            assert [c.ids[i] for i in outside] == [s.ids[i] for i in outside]
            text = grown.tokenizer.decode(c.ids[: s.answer_span[0]])
            assert str(s.fields["key"]) not in text and str(s.fields["key"]) in grown.tokenizer.decode(s.ids)


def test_control_is_chance_for_a_keyed_needle_and_shows_a_leaking_one(grown, haystack):
    from ctxext.evaluation.control import evaluate_control
    from ctxext.evaluation.sections.grids.engine import GridSettings, evaluate_task_grid
    from ctxext.tasks import Template

    settings = GridSettings(lengths=[64], depths=[10, 50, 90], trials=20)
    grid = evaluate_task_grid(grown, settings, "needle", haystack, 0, None, False)
    control = evaluate_control(grown, settings, "needle", haystack, 0)
    assert grid["overall"]["accuracy"] >= 0.8, grid["overall"]
    assert control["by_length"]["64"]["trials"] == 20 and control["overall"]["correct"] == 0
    assert control["depth"] == 50 and control["overall"]["ci_high"] < 0.2  # Wilson: 0 / 20 → [0, 16 %]
    leak = Template(needle="\nKEY_ab = 48213\n", question="\nassert KEY_ab == 48213\nassert KEY_ab ==", answer=" 48213")
    leaked = evaluate_control(grown, settings, "needle", haystack, leak)
    assert leaked["overall"]["accuracy"] >= 0.8, leaked


def test_ruler_section_reports_the_control(grown, tmp_path):
    from ctxext.evaluation.report import render_markdown
    from ctxext.evaluation.sections.ruler.engine import RulerSettings, RulerTaskSpec, evaluate_ruler

    settings = RulerSettings(
        tasks=[RulerTaskSpec(task="needle"), RulerTaskSpec(task="copy_span", options={"span": 4})],
        lengths=[64],
        depths=[50],
        trials=3,
        templates=[0],
        control=True,
    )
    res = evaluate_ruler(grown, settings, False)
    assert res["tasks"]["needle"]["control"]["overall"]["trials"] == 3
    entry = {"name": "grown", "rope": grown.rope.to_dict(), "ruler": res}
    from ctxext.evaluation.report import build_report

    md = render_markdown(build_report([entry]))
    assert "No-needle control" in md and "| needle |" in md
