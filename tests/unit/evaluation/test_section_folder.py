"""A suite section added as one folder plus one registry line reaches the report, the card and the comparison.

The test writes a throwaway section package, ``echo/`` (settings, results schema, engine and the section
class, as ``ctxext/evaluation/sections/<name>/`` holds a built-in one), imports it (its ``@register_section``
line registers it), runs ``ctxext eval echo`` on two models and reads what came out: ``report.json`` with the
section's part typed by its schema (a damaged value is refused by name), ``report.md``, the paired comparison
and the model card. Nothing else is edited.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.errors import InputError

FILES = {
    "settings.py": '''
        from pydantic import BaseModel, ConfigDict, Field


        class EchoSettings(BaseModel):
            """The echo: section of a suite."""

            model_config = ConfigDict(extra="forbid")
            lengths: list[int | str] = Field(default_factory=lambda: ["1x"], description="lengths (tokens or 2x)")
            trials: int = Field(default=2, gt=0, description="random spans per length")
            seed: int = Field(default=0, description="seed of the spans")
    ''',
    "schema.py": """
        from pydantic import Field

        from ctxext.artifacts.report import Count, Fraction, Section


        class EchoLength(Section):
            accuracy: Fraction = None
            trials: Count = None


        class Echo(Section):
            by_length: dict[str, EchoLength]
            per_trial: dict[str, list[Fraction]] = Field(default_factory=dict)
    """,
    "engine.py": '''
        def evaluate_echo(loaded, settings, lengths):
            """Share of a repeated random span's second copy the model predicts (argmax, teacher-forced)."""
            import torch

            from ctxext.rope.runtime import reset_dynamic_rope

            generator = torch.Generator().manual_seed(settings.seed)
            by_length, per_trial = {}, {}
            for length in lengths:
                half, scores = length // 2, []
                for _ in range(settings.trials):
                    span = torch.randint(0, loaded.model.config.vocab_size, (1, half), generator=generator)
                    ids = torch.cat([span, span], dim=1).to(loaded.device)
                    reset_dynamic_rope(loaded.model)
                    with torch.no_grad():
                        logits = loaded.model(ids).logits
                    scores.append(float((logits[0, half - 1 : -1].argmax(-1) == ids[0, half:]).float().mean()))
                by_length[str(length)] = {"accuracy": sum(scores) / len(scores), "trials": len(scores)}
                per_trial[str(length)] = scores
            return {"by_length": by_length, "per_trial": per_trial}
    ''',
    "__init__.py": '''
        from ctxext.evaluation.sections import SuiteSection, register_section

        from .schema import Echo
        from .settings import EchoSettings


        @register_section
        class EchoSection(SuiteSection):
            """Copy accuracy of a repeated random span, by length."""

            name = "echo"
            title = "Echo"
            settings = EchoSettings
            schema = Echo

            def run(self, loaded, settings, lengths, beyond_context_ok, show):
                from .engine import evaluate_echo

                return evaluate_echo(loaded, settings, lengths)

            def paired(self, model, reference, resamples, seed, notes):
                import numpy as np

                from ctxext.scoring.stats import paired_mean_difference

                a, b = model["echo"]["per_trial"], reference["echo"]["per_trial"]
                return [
                    {"model": model["name"], "length": int(L), **paired_mean_difference(np.array(a[L]), np.array(b[L]))}
                    for L in sorted(set(a) & set(b), key=int)
                ]

            def card_rows(self, models, report):
                lines = ["Echo accuracy:", "", "| model | length | accuracy |", "| --- | --- | --- |"]
                for m in models:
                    lines += [f"| {m['name']} | {L} | {e['accuracy']:.2f} |" for L, e in m["echo"]["by_length"].items()]
                return lines + [""]

            def card_results(self, entry, report):
                return [
                    {"task": "Echo", "dataset_type": "echo", "dataset_name": "random spans", "metric": "accuracy",
                     "label": "Echo accuracy", "length": L, "value": round(100 * e["accuracy"], 2)}
                    for L, e in entry["echo"]["by_length"].items()
                ]
    ''',
}


@pytest.fixture
def echo(tmp_path, monkeypatch):
    from ctxext.evaluation.sections import SECTIONS, unregister_section

    folder = tmp_path / "plugins" / "echo"
    folder.mkdir(parents=True)
    for name, text in FILES.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(folder.parent))
    module = importlib.import_module("echo")  # the registry line: @register_section
    yield SECTIONS["echo"], module
    unregister_section("echo")
    for name in [m for m in sys.modules if m == "echo" or m.startswith("echo.")]:
        del sys.modules[name]


def test_a_section_folder_reaches_report_card_and_comparison(echo, tiny_model_dir, tmp_path):
    from ctxext.artifacts.report import SECTION_SCHEMAS, read_report
    from ctxext.artifacts.run import RunRecord, load_report
    from ctxext.publish.card import card_inputs, eval_results, render_card

    section, module = echo
    assert SECTION_SCHEMAS["echo"] is module.schema.Echo
    out = tmp_path / "rep"
    models = ["--model", str(tiny_model_dir), "--name", "a", "--model", str(tiny_model_dir), "--name", "b"]
    args = ["eval", "echo", *models, "--lengths", "32,64", "--trials", "2", "-q", "--out", str(out)]
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output

    # report.json: the section's part under its key, typed by its schema when read back.
    report = read_report(out)
    typed = report.models[0].section("echo", module.schema.Echo)
    assert isinstance(typed, module.schema.Echo) and set(typed.by_length) == {"32", "64"}
    assert all(0 <= e.accuracy <= 1 and e.trials == 2 for e in typed.by_length.values())

    # report.md: its part (the default table) and its paired table; the paired rows, in the Holm family.
    markdown = (out / "report.md").read_text()
    assert "## Echo" in markdown and "by_length.64.accuracy" in markdown
    assert "### Echo, paired against `a`" in markdown
    rows = report.comparisons.rows("echo")
    assert [(r["model"], r["length"]) for r in rows] == [("b", 32), ("b", 64)]
    assert all(r["difference"] == 0 and "p_holm" in r for r in rows)  # the same model twice, the same spans

    # The model card: the rows and the model-index results the section rendered when the report was written.
    run = RunRecord(status="complete", base_model=str(tiny_model_dir), method="none", target_length=None)
    inputs = card_inputs(tiny_model_dir, run, [load_report(out)])
    card = render_card(inputs)
    assert "Echo accuracy:" in card and "| b | 64 |" in card
    assert {(r.metric_name, r.dataset_type) for r in eval_results(inputs)} == {
        ("Echo accuracy @ 32 tokens", "echo"),
        ("Echo accuracy @ 64 tokens", "echo"),
    }

    # A damaged value is refused by its path, like a built-in section's.
    data = json.loads((out / "report.json").read_text())
    data["models"][1]["echo"]["by_length"]["64"]["accuracy"] = 1.5
    (out / "report.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"models\.1\.echo\.by_length\.64\.accuracy: Value error, 1\.5 is above 1"):
        read_report(out)

    # Unregistered, the section's part is kept as it is (a report of a plugin this process has not imported).
    from ctxext.evaluation.sections import unregister_section

    unregister_section("echo")
    kept = read_report(out)
    assert isinstance((kept.models[1].model_extra or {})["echo"], dict)
    assert json.loads(kept.to_json())["models"][1]["echo"]["by_length"]["64"]["accuracy"] == 1.5
