"""RULER-style suite section: effective length, template choice, trained-task marks, suite run and report."""

from __future__ import annotations

import json

import pytest

from ctxext.errors import InputError
from ctxext.evaluation.sections.ruler.engine import effective_length, template_indices, trained_tasks


def test_effective_length():
    scores = {64: 0.9, 128: 0.8, 256: 0.5}
    e = effective_length(scores, 64, 0.85)
    assert e["length"] == 128 and e["threshold"] == pytest.approx(0.765) and e["reference_score"] == 0.9
    assert effective_length(scores, 64, 0.6, "absolute")["length"] == 128
    assert effective_length(scores, 64, 0.95, "absolute")["length"] is None
    # A passing length after a failing one does not count.
    assert effective_length({64: 0.9, 128: 0.2, 256: 0.9}, 64, 0.85)["length"] == 64
    zero = effective_length({64: 0.0, 128: 0.0}, 64, 0.85)
    assert zero["length"] is None and "0 %" in zero["note"]
    # 85 % of a 2 % reference would pass anything: below min_reference there is no relative threshold.
    low = effective_length({64: 0.02, 128: 0.04, 256: 0.02}, 64, 0.85, min_reference=0.25)
    assert low["length"] is None and low["threshold"] is None and "2 %" in low["note"]
    with pytest.raises(InputError, match="no score at the original length 32"):
        effective_length(scores, 32, 0.85)


def test_template_choices():
    assert template_indices("multikey", "heldout") == [4]
    assert template_indices("multikey", "training") == [0, 1, 2, 3]
    assert template_indices("multikey", "all") == [0, 1, 2, 3, 4]
    assert template_indices("multikey", [0, 2]) == [0, 2]
    with pytest.raises(InputError, match="templates 0–4; template 7"):
        template_indices("multikey", [7])
    with pytest.raises(InputError, match="use heldout, training, all"):
        template_indices("multikey", "some")


def test_trained_tasks_hook(tmp_path):
    assert trained_tasks(None) is None and trained_tasks(str(tmp_path)) is None
    (tmp_path / "recipe.yaml").write_text("data:\n  path: builtin:stdlib\n")
    assert trained_tasks(str(tmp_path)) == []
    (tmp_path / "recipe.yaml").write_text(
        "data:\n  mixture:\n    - {task: multikey, weight: 2}\n    - {source: 'task:needle', weight: 1}\n"
        "    - {path: builtin:stdlib, weight: 1}\n    - just-a-string\n"
    )
    assert trained_tasks(str(tmp_path)) == ["multikey", "needle"]
    (tmp_path / "recipe.yaml").write_text("data: [: not yaml")
    assert trained_tasks(str(tmp_path)) is None


def test_suite_ruler_section_runs_and_reports(tiny_model_dir, tmp_path):
    from ctxext.evaluation.suite import load_suite, run_suite
    from ctxext.models.load import ModelSpec

    path = tmp_path / "r.yaml"
    path.write_text(
        "name: r\nruler:\n  lengths: [200, '1x']\n  depths: [20, 80]\n  trials: 2\n  templates: [0, 1]\n"
        "  tasks:\n    - {task: needle}\n    - {task: multikey, name: mk, options: {distractors: 1}}\n"
    )
    suite, _ = load_suite(path)
    out = tmp_path / "out"
    rep = run_suite(suite, [ModelSpec(str(tiny_model_dir), name="tiny")], out, str(path), show_progress=False)
    r = rep["models"][0]["ruler"]
    assert list(r["tasks"]) == ["needle", "mk"] and r["original_length"] == 256
    assert r["settings"]["lengths"] == [200, 256] and r["scoring"] == "teacher-forced"
    mk = r["tasks"]["mk"]
    assert mk["registry_task"] == "multikey" and mk["options"] == {"distractors": 1} and mk["template"] == [0, 1]
    assert all(c["trials"] == 2 for c in mk["cells"]) and len(mk["cells"]) == 4
    assert "effective_length" in mk and "length" in r["effective_length"]
    # The default is RULER's absolute 85.6 %: every task counts in the overall, and the random tiny model,
    # which retrieves nothing, has no effective length; NoLiMa's relative bar has no reference in any task.
    assert r["settings"]["threshold"] == 0.856 and r["settings"]["threshold_reference"] == "absolute"
    assert r["effective_length"]["tasks"] == ["needle", "mk"] and r["effective_length"]["length"] is None
    nolima = r["effective_lengths"]["teacher_forced"]["nolima"]
    assert nolima["tasks"] == [] and nolima["length"] is None
    assert set(r["scores"]["needle"]) == {"200", "256"}
    assert r["trained_tasks"] is None  # a plain model folder, not a run
    md = (out / "report.md").read_text()
    assert "## RULER-style tasks" in md and "### Effective length" in md and "mk" in md
    assert (out / "ruler_heatmap.png").stat().st_size > 1000
    assert json.loads((out / "report.json").read_text())["models"][0]["ruler"]["tasks"]["needle"]["cells"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("  tasks:\n    - {task: nope}\n", "unknown task 'nope'"),
        ("  tasks:\n    - {task: needle}\n    - {task: needle}\n", "appear twice"),
        ("  tasks:\n    - {task: multikey, options: {distractor: 2}}\n", "unknown option"),
        ("  templates: [9]\n  tasks:\n    - {task: needle}\n", "template 9 does not exist"),
        ("  threshold: 1.5\n  tasks:\n    - {task: needle}\n", "ruler.threshold"),
        ("  tasks: []\n", "at least one task"),
    ],
)
def test_suite_ruler_section_errors(tmp_path, body, message):
    from ctxext.evaluation.suite import load_suite

    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nruler:\n" + body)
    with pytest.raises(InputError, match=message):
        load_suite(path)
