"""Reports (JSON schema, Markdown, PNG plots), suites, run-folder loading and the ``ctxext eval`` CLI."""

from __future__ import annotations

import json
import types

import pytest
import torch
from typer.testing import CliRunner

from ctxext.evaluation.report import SCHEMA, build_report, model_entry, write_report
from ctxext.evaluation.sections.grids.engine import GridSettings, evaluate_passkey
from ctxext.evaluation.sections.perplexity.engine import evaluate_perplexity
from ctxext.evaluation.sections.perplexity.settings import PerplexitySettings
from tests.helpers import ROOT
from tests.helpers.evaluation import (
    loaded,
    one_thread,  # noqa: F401  (autouse: one thread per test)
    stdlib_texts,
    tiny_lm,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check_png(path):
    import matplotlib.image as mpimg

    assert path.read_bytes()[:8] == PNG_MAGIC
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_report_two_models_side_by_side(tiny_tokenizer, tmp_path):
    texts = stdlib_texts(5, min_chars=1500)
    entries = []
    for name, method in (("base", None), ("yarn", "yarn")):
        lm = loaded(tiny_lm(tiny_tokenizer, method, target=512), tiny_tokenizer, name)
        e = model_entry(lm)
        e["perplexity"] = evaluate_perplexity(
            lm,
            texts,
            PerplexitySettings(
                lengths=[128, 256], bucket_size=64, context_limits=[32], resamples=100, allow_beyond_context=True
            ),
            False,
        )
        e["passkey"] = evaluate_passkey(lm, GridSettings(lengths=[180, 256], depths=[0, 100], trials=1), False)
        entries.append(e)
    report = build_report(entries, data={"perplexity": {"source": "stdlib"}})
    out = write_report(report, tmp_path / "rep")
    data = json.loads((out / "report.json").read_text())
    assert data["schema"] == SCHEMA
    assert [m["name"] for m in data["models"]] == ["base", "yarn"]
    yarn = data["models"][1]
    assert yarn["rope"]["rope_type"] == "yarn" and yarn["rope"]["factor"] == 2.0
    by_len = yarn["perplexity"]["by_length"]
    assert set(by_len) == {"128", "256"}
    assert set(by_len["256"]) >= {"ppl", "nll", "tokens", "documents", "ci_low", "ci_high"}
    bucket = yarn["perplexity"]["by_bucket"][1]
    assert bucket["start"] == 64 and bucket["end"] == 128 and set(bucket) >= {"tokens", "nll", "ppl"}
    assert "truncated-document" in yarn["perplexity"]["protocol"]
    assert yarn["perplexity"]["short_context"]["length"] == 256
    md = (out / "report.md").read_text()
    assert "| length | base | yarn |" in md and "Passkey retrieval" in md and "Context use" in md
    # Paired comparisons against the first model: per length and bucket, and McNemar on passkey trials.
    comp = data["comparisons"]
    assert comp["reference"] == "base"
    by_len = {r["length"]: r for r in comp["perplexity"] if r["view"] == "length"}
    assert set(by_len) == {128, 256}
    for L, r in by_len.items():
        ratio = (
            yarn["perplexity"]["by_length"][str(L)]["ppl"] / data["models"][0]["perplexity"]["by_length"][str(L)]["ppl"]
        )
        assert r["ratio"] == pytest.approx(ratio, rel=1e-9) and r["ci_low"] <= r["ratio"] <= r["ci_high"]
    assert len([r for r in comp["perplexity"] if r["view"] == "bucket"]) == 4
    cell = yarn["passkey"]["cells"][0]
    assert len(cell["outcomes"]) == cell["trials"] and sum(cell["outcomes"]) == cell["correct"]
    assert {r["length"] for r in comp["grids"]} == {180, 256, "all"}
    assert "## Paired comparisons against `base`" in md and "p Holm" in md
    for png in ("ppl_by_position.png", "ppl_by_length.png", "context_use.png", "passkey_heatmap.png"):
        _check_png(out / png)
    # Writing again replaces the report whole, with --overwrite only.
    from ctxext.errors import InputError

    with pytest.raises(InputError, match="already exists"):
        write_report(report, out)
    write_report(report, out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir):
    """A ctxext-style run folder: run.json, a LoRA adapter with non-zero weights, the patched config."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ctxext.rope.runtime import patch_model

    run = tmp_path_factory.mktemp("run")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    patch_model(model, "yarn", 512)
    model.config.save_pretrained(run)
    torch.manual_seed(1)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(run)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(run)
    record = {"status": "complete", "base_model": str(tiny_model_dir), "method": "yarn", "target_length": 512}
    (run / "run.json").write_text(json.dumps(record))
    return run


def test_run_folder_loads_base_adapter_and_patched_rope(run_dir, tiny_model_dir):
    from ctxext.artifacts.run import is_run_folder
    from ctxext.models.load import ModelSpec, load_model

    assert is_run_folder(run_dir)
    ft = load_model(ModelSpec(ref=str(run_dir)))
    assert ft.rope.rope_type == "yarn" and ft.context_length == 512 and ft.info["rope_verified"]
    assert ft.info["adapter"] == str(run_dir)
    patched = load_model(ModelSpec(ref=str(tiny_model_dir), config_from=str(run_dir)))
    assert patched.rope.rope_type == "yarn" and patched.info["adapter"] is None
    x = torch.arange(3, 60)[None]
    with torch.no_grad():
        assert not torch.allclose(ft.model(x).logits, patched.model(x).logits)  # the adapter is applied


def test_run_suite_for_run_compares_base_patched_finetuned(run_dir, tmp_path):
    from ctxext.evaluation.suite import run_suite_for_run

    suite = tmp_path / "s.yaml"
    suite.write_text(
        "name: t\nperplexity:\n  data: builtin:stdlib\n  lengths: ['1x', '2x']\n  bucket_size: auto\n"
        "  max_docs: 3\n  resamples: 50\npasskey:\n  lengths: [256]\n  depths: [50]\n  trials: 1\n"
    )
    recipe = types.SimpleNamespace(eval=types.SimpleNamespace(suite=str(suite), compare_base=True))
    out = run_suite_for_run(run_dir, recipe, show_progress=False)
    assert out == run_dir / "eval"
    rep = json.loads((out / "report.json").read_text())
    names = [m["name"] for m in rep["models"]]
    assert names == ["base", "patched only", "fine-tuned"]
    base, patched, ft = rep["models"]
    assert base["rope"]["rope_type"] == "default" and ft["rope"]["rope_type"] == "yarn"
    assert base["perplexity"]["by_length"]["512"]["beyond_context"] is True
    assert ft["perplexity"]["by_length"]["512"]["beyond_context"] is False
    assert rep["suite"]["reference_context"] == 512
    assert all(m["perplexity"]["short_context"]["length"] == 256 for m in rep["models"])
    _check_png(out / "ppl_by_position.png")


def test_cli_ppl_and_errors(tiny_model_dir, tmp_path):
    from ctxext.cli.commands import app

    doc = tmp_path / "doc.txt"
    doc.write_text(
        "\n".join(p.read_text() for p in __import__("ctxext.models.builtin").models.builtin.stdlib_files()[:3])
    )
    runner = CliRunner()
    out = tmp_path / "out"
    res = runner.invoke(
        app,
        [
            "eval",
            "ppl",
            "--model",
            str(tiny_model_dir),
            "--data",
            str(doc),
            "--lengths",
            "64,128",
            "--bucket-size",
            "32",
            "--out",
            str(out),
            "--quiet",
            "--min-docs",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    rep = json.loads((out / "report.json").read_text())
    assert rep["models"][0]["perplexity"]["by_length"]["128"]["documents"] == 1
    cases = [
        (["--data", str(doc), "--lengths", "64,128"], "1 document(s) reach 128 tokens"),
        (["--data", str(tmp_path / "nope.jsonl"), "--lengths", "64"], "does not exist"),
        # eval ppl runs a one-section suite: a relative length above the context is dropped, none is left.
        (["--data", str(doc), "--lengths", "4x"], "no length left at or below the reference context 256"),
        (["--data", str(doc), "--lengths", "128", "--bucket-size", "48"], "does not divide"),
    ]
    for args, message in cases:
        res = runner.invoke(app, ["eval", "ppl", "--model", str(tiny_model_dir), *args, "--out", str(tmp_path / "x")])
        assert res.exit_code == 2, res.output
        assert message in " ".join(res.output.split())
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": ""}\n')
    res = runner.invoke(
        app,
        ["eval", "ppl", "--model", str(tiny_model_dir), "--data", str(empty), "--lengths", "64", "--out", str(out)]
        + ["--overwrite"],
    )
    assert res.exit_code == 2 and "no documents" in " ".join(res.output.split())
    assert json.loads((out / "report.json").read_text()) == rep  # a failed run leaves the old report whole
    assert not (tmp_path / "x").exists()


def test_shipped_suites_validate_and_resolve_lengths():
    from pathlib import Path

    from ctxext.errors import InputError
    from ctxext.evaluation.lengths import resolve_length, resolve_lengths
    from ctxext.evaluation.suite import load_suite

    suites = sorted((ROOT / "eval").glob("*.yaml"))
    assert {p.name for p in suites} >= {"long-context.yaml", "tiny-cpu.yaml"}
    for path in suites:
        suite, _ = load_suite(path)
        assert suite.perplexity is not None or suite.ruler is not None
        if suite.qa is not None:
            assert Path(suite.qa.data).is_file()
    suite, _ = load_suite(suites[0], ["passkey.trials=9", "perplexity.max_docs=3"])
    assert suite.passkey.trials == 9 and suite.perplexity.max_docs == 3
    assert resolve_length("2x", 4096, 32768) == 8192 and resolve_length("target", 4096, 32768) == 32768
    assert resolve_lengths(["1x", "16x"], 4096, 32768, False) == ([4096], [65536])
    assert resolve_length("2x target", 4096, 32768) == 65536
    assert resolve_lengths(["1x", "2x target", "16x"], 4096, 32768, False) == ([4096, 65536], [65536])
    with pytest.raises(InputError, match="token count"):
        resolve_length("long", 4096, 32768)
    with pytest.raises(InputError, match="perplexity.lengths"):
        load_suite(suites[0], ["perplexity.lengths=5"])
    with pytest.raises(InputError, match="does not exist"):
        load_suite("eval/nope.yaml")


def test_suite_beyond_target_and_original_window_in_context_use(tiny_model_dir, tmp_path):
    from ctxext.evaluation.suite import load_suite, run_suite
    from ctxext.models.load import ModelSpec

    path = tmp_path / "beyond.yaml"
    path.write_text(
        "name: beyond\nperplexity:\n  data: builtin:stdlib\n  lengths: ['1x', '2x target']\n"
        "  bucket_size: 128\n  context_limits: [32]\n  max_docs: 3\n  resamples: 50\n"
    )
    suite, _ = load_suite(path)
    report = run_suite(suite, [ModelSpec(str(tiny_model_dir), name="tiny")], tmp_path / "rep", show_progress=False)
    assert report["suite"]["beyond_target"] == [512]
    ppl = report["models"][0]["perplexity"]
    assert ppl["by_length"]["512"]["beyond_context"] is True and ppl["by_length"]["256"]["beyond_context"] is False
    cu = ppl["context_use"]
    assert cu["original_window"] == 256 and [e["context"] for e in cu["limits"]] == [32, 256]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "**Beyond target**: lengths 512" in md and "256 (original window)" in md
