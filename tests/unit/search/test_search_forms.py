"""The needle objective uses only the forms the base retrieves inside its own window (``ctxext.search.forms``)."""

from __future__ import annotations

import json

import pytest

from ctxext.errors import InputError
from ctxext.models.builtin import GROWN_DIR
from ctxext.search.forms import check_forms, usable_templates
from ctxext.search.run import run_search
from ctxext.tasks.forms import FormCheck
from tests.unit.search.test_search import _settings

needs_grown = pytest.mark.skipif(
    not (GROWN_DIR / "model.safetensors").is_file(), reason="the grown model is not packaged"
)


@needs_grown
def test_grown_model_keeps_only_the_form_it_was_trained_to_retrieve():
    from ctxext.models.load import ModelSpec, load_model

    lm = load_model(ModelSpec("builtin:grown-code-64"))
    checks = check_forms(lm.model, lm.tokenizer, "builtin:stdlib-train", 64, [0, 1, 2, 3], seed=0)
    by_form = {c.template: c for c in checks}
    # KEY_xy = … is the form the grown model was pretrained on; config['xy'] and the comment form it never
    # retrieves; the prose form does not fit in 64 tokens at all.
    assert by_form[0].kept and by_form[0].accuracy is not None and by_form[0].accuracy >= 0.9
    # Each check ends once its decision is certain: 16 of 32 retrieved keeps form 0; 17 misses drop a form.
    assert by_form[0].planned == 32 and 16 <= by_form[0].probes < 32
    for form in (1, 2):
        assert not by_form[form].kept and by_form[form].accuracy is not None and by_form[form].accuracy < 0.5
        assert 17 <= by_form[form].probes < 32
    assert by_form[3].accuracy is None and not by_form[3].kept
    assert usable_templates(checks, 64) == [0]


def test_no_usable_form_is_a_clear_error():
    checks = [FormCheck(0, 0.1, 20, False, 32), FormCheck(3, None, 0, False, 32)]
    with pytest.raises(InputError) as err:
        usable_templates(checks, 64)
    text = str(err.value)
    assert "form 0: 10 % of the first 20 probes" in text and "form 3: does not fit" in text
    assert "--objective far-ppl" in text


class _Scripted:
    """Stands in for ``score_answers``: the probes' outcomes in the order they are scored."""

    def __init__(self, outcomes: list[bool]):
        self.outcomes, self.calls = list(outcomes), 0

    def __call__(self, model, sequences, spans, answer_only=True):
        from ctxext.scoring.answers import AnswerScore

        self.calls += 1
        return [AnswerScore(correct=self.outcomes.pop(0), nll=0.0, n_tokens=1)]


@pytest.mark.parametrize(
    ("outcomes", "kept", "scored"),
    [
        ([True] * 8, True, 4),  # 4 of 8 retrieved: kept whatever the rest say
        ([False] * 8, False, 5),  # 5 misses: 3 left cannot make 4
        ([True, False] * 4, True, 7),  # the 4th hit comes with the 7th probe
        ([False, True] * 4, True, 8),  # undecided until the last
    ],
)
def test_a_form_check_stops_once_its_decision_is_certain(monkeypatch, outcomes, kept, scored):
    import ctxext.scoring.answers as answers
    from ctxext.tasks.forms import _score_until_decided

    scripted = _Scripted(outcomes)
    monkeypatch.setattr(answers, "score_answers", scripted)
    correct, done = _score_until_decided(None, [[0]] * 8, [(0, 1)] * 8, per_depth=1, min_accuracy=0.5)
    assert (correct >= 4, done, scripted.calls) == (kept, scored, scored)


def test_search_of_a_model_that_retrieves_nothing_stops_before_searching(tiny_model_dir, tmp_path):
    out = tmp_path / "s"
    with pytest.raises(InputError) as err:
        run_search(_settings(tiny_model_dir, out, min_form_accuracy=50.0), log=lambda _: None)
    assert "retrieves none of the needle forms" in str(err.value)
    assert not out.exists()  # checked before the log is opened: nothing written


def test_the_kept_forms_are_logged_and_checked_on_resume(tiny_model_dir, tmp_path):
    out = tmp_path / "r"
    run_search(_settings(tiny_model_dir, out, generations=0), log=lambda _: None)
    header = json.loads((out / "search.jsonl").read_text().splitlines()[0])
    forms = header["objective_set"]["forms"]
    assert [f["template"] for f in forms] == [0, 1, 2, 3] and all(f["kept"] for f in forms)
    assert header["objective_set"]["templates"] == [0, 1, 2, 3]
    assert header["settings"]["min_form_accuracy"] == 0.0


class _Clock:
    """A forward clock that says every forward takes ``seconds`` (whatever its length)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def seconds_at(self, length: int, logits: int = 1) -> float:
        return self.seconds

    def note(self) -> str:
        return "test clock"


def test_the_form_check_keeps_to_a_quarter_of_the_budget(tmp_path):
    from ctxext.search.session import form_check_probes

    # 4 forms × 8 depths × 10 s = 320 s per probe per depth: a 10 h budget affords the full 4, 1 h two, 1 min one.
    for budget, probes in (("10h", 4), ("1h", 2), ("60s", 1)):
        settings = _settings(tmp_path, tmp_path / "s", budget=budget)
        assert form_check_probes(settings, 4, 8192, _Clock(10.0)) == (probes, probes * 320.0)


def test_the_search_says_up_front_what_it_runs_and_how_long(tiny_model_dir, tmp_path):
    lines: list[str] = []
    out = tmp_path / "r"
    run_search(_settings(tiny_model_dir, out, generations=0), log=lines.append)
    check = next(line for line in lines if line.startswith("checking which needle forms"))
    assert "4 forms × 8 depths × 4 probe(s), at most about" in check and "-token forward took" in check
    plan = next(line for line in lines if line.startswith("each candidate scores"))
    assert "8 sequence(s) of" in plan and "or as many as --budget 10m allows" in plan, plan
    # A resumed search checks the forms with the probes it logged, whatever the clock says now.
    header = json.loads((out / "search.jsonl").read_text().splitlines()[0])
    assert {f["planned"] for f in header["objective_set"]["forms"] if f["accuracy"] is not None} == {32}
