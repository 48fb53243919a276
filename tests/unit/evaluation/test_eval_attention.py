"""Attention diagnostics: probabilities recomputed from q / k equal eager attention's; statistics add up."""

from __future__ import annotations

import pytest
import torch

from ctxext.errors import InputError
from ctxext.evaluation.sections.attention.engine import (
    AttentionSettings,
    attention_modules,
    attention_probs,
    evaluate_attention,
    rotated_qk,
)
from tests.helpers.evaluation import (
    loaded,
    one_thread,  # noqa: F401  (autouse: one thread per test)
    stdlib_texts,
)


def _eager(tokenizer, method=None):
    from transformers import AutoModelForCausalLM

    from ctxext.rope.runtime import patch_model
    from tests.helpers.tiny import tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        tiny_config("llama", vocab_size=len(tokenizer)), attn_implementation="eager"
    ).eval()
    if method:
        patch_model(model, method, 1024)
    return model


@pytest.mark.parametrize("method", [None, "yarn"])
def test_recomputed_probabilities_equal_eager_attention(tiny_tokenizer, method):
    model = _eager(tiny_tokenizer, method)
    ids = torch.tensor(tiny_tokenizer(stdlib_texts(1)[0])["input_ids"][:96])[None]
    captured = {}

    def hook(i):
        def fn(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            q, k = rotated_qk(module, hidden, kwargs["position_embeddings"])
            # Two query blocks, to exercise the blocked path.
            first = attention_probs(q[0], k[0], module.scaling, 0, 40)  # keys 0..39, padded below
            rest = attention_probs(q[0], k[0], module.scaling, 40, 96)
            captured[i] = torch.cat([torch.nn.functional.pad(first, (0, 56)), rest], dim=1)

        return fn

    handles = [m.register_forward_pre_hook(hook(i), with_kwargs=True) for i, m in enumerate(attention_modules(model))]
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    for h in handles:
        h.remove()
    for i, ref in enumerate(out.attentions):
        torch.testing.assert_close(captured[i], ref[0].float(), atol=1e-5, rtol=1e-4)


def test_statistics_sum_to_one_and_errors(tiny_tokenizer):
    from tests.helpers.evaluation import tiny_lm

    lm = loaded(tiny_lm(tiny_tokenizer, "yarn", target=1024), tiny_tokenizer)
    texts = stdlib_texts(4, min_chars=2000)
    res = evaluate_attention(lm, texts, AttentionSettings(length=256, docs=2), show_progress=False)
    assert res["length"] == 256 and res["documents"] == 2 and res["original_length"] == 256
    assert res["band_labels"] == ["0–1%", "1–10%", "10–50%", "50–100%"]
    for layer in res["layers"]:
        assert sum(layer["bands"]) == pytest.approx(1.0, abs=1e-6)
        assert 0 <= layer["sinks"] <= 1 and layer["beyond_original"] == 0.0  # no key is 256 tokens back
        assert len(layer["entropy_by_position"]) == 8
        # Entropy is at most log(number of visible keys); the first bucket's queries see at most 32 keys.
        assert 0 <= layer["entropy_by_position"][0] <= torch.log(torch.tensor(32.0)) + 1e-6
    with pytest.raises(InputError, match="reach 512 tokens"):
        evaluate_attention(lm, [t[:300] for t in texts], AttentionSettings(length=512, docs=2), show_progress=False)
    with pytest.raises(InputError, match="beyond it"):
        evaluate_attention(lm, texts, AttentionSettings(length=2048), show_progress=False)
    with pytest.raises(InputError, match="bands"):
        evaluate_attention(lm, texts, AttentionSettings(length=64, bands=[0.5, 0.1]), show_progress=False)


def test_cli_attention_two_models_report_plot_and_paired_difference(tiny_model_dir, tmp_path):
    import json

    from typer.testing import CliRunner

    from ctxext.cli.commands import app

    runner = CliRunner()
    out = tmp_path / "attn"
    args = ["eval", "attention", "--model", str(tiny_model_dir), "--model", str(tiny_model_dir)]
    args += ["--length", "128", "--docs", "3", "--out", str(out), "--quiet"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    rep = json.loads((out / "report.json").read_text())
    a, b = (m["attention"] for m in rep["models"])
    assert a["layers"] == b["layers"] and len(a["per_document"]["beyond_original"]) == 3
    (row,) = rep["comparisons"]["attention"]
    assert row["difference"] == 0.0 and row["documents"] == 3  # the same model twice: no difference
    md = (out / "report.md").read_text()
    assert "## Attention diagnostics" in md and "![attention diagnostics](attention.png)" in md
    assert (out / "attention.png").read_bytes()[:4] == b"\x89PNG"
    # One driver for every section: a token count past the context is measured there (marked †) up to 8× the
    # reference context, like every suite length; past that it is refused before any model runs, nothing written.
    bad = runner.invoke(
        app, ["eval", "attention", "--model", str(tiny_model_dir), "--length", "4096", "--out", str(tmp_path / "x")]
    )
    assert bad.exit_code == 2 and "8x" in bad.output and "--allow-beyond-context" in " ".join(bad.output.split())
    assert not (tmp_path / "x").exists()


def test_bad_bands_are_refused_as_a_flag_and_a_suite_key(tmp_path):
    # Checked where declared (the section's settings): before any model is loaded, named by flag or key.
    from typer.testing import CliRunner

    from ctxext.cli.commands import app
    from ctxext.evaluation.suite import load_suite

    args = ["eval", "attention", "--model", "builtin:tiny-llama", "--bands", "0.5,0.1", "--out", str(tmp_path / "x")]
    bad = CliRunner().invoke(app, args)
    assert bad.exit_code == 2 and "--bands" in bad.output and "increasing fractions" in bad.output
    assert not (tmp_path / "x").exists()
    suite = tmp_path / "s.yaml"
    suite.write_text("name: s\nattention: {bands: [0.2, 1.5]}\n")
    with pytest.raises(InputError, match="attention.bands"):
        load_suite(suite)
