"""Perplexity by length / bucket / context limit against an independent full-logits computation."""

from __future__ import annotations

import math

import pytest
import torch

from ctxext.errors import InputError
from ctxext.evaluation.sections.perplexity.engine import evaluate_perplexity
from ctxext.evaluation.sections.perplexity.settings import PerplexitySettings
from ctxext.scoring.nll import sliding_nll, sliding_windows, token_nll
from tests.helpers.evaluation import (
    loaded,
    one_thread,  # noqa: F401  (autouse: one thread per test)
    reference_bucket,
    reference_ppl,
    stdlib_texts,
    tiny_lm,
)


@pytest.fixture(scope="module")
def texts():
    return stdlib_texts(6, min_chars=1500)


def _docs(tok, texts):
    return [tok(t)["input_ids"] for t in texts]


@pytest.mark.parametrize("method", [None, "yarn"])
def test_ppl_matches_full_logits(tiny_tokenizer, texts, method):
    model = tiny_lm(tiny_tokenizer, method, target=512)
    lm = loaded(model, tiny_tokenizer)
    lengths = [64, 192, 384] if method else [64, 128, 256]
    settings = PerplexitySettings(lengths=lengths, bucket_size=64, short_context=False, resamples=200)
    res = evaluate_perplexity(lm, texts, settings, show_progress=False)
    assert res["mode"] == "one-pass"
    docs = _docs(tiny_tokenizer, texts)
    longest = lengths[-1]
    common = [d for d in docs if len(d) >= longest]
    assert res["document_set"] == "common" and res["documents"]["common"] == len(common)
    for L in lengths:
        # Main view: every length on the documents reaching the longest length.
        ref, count = reference_ppl(model, common, L)
        entry = res["by_length"][str(L)]
        assert entry["tokens"] == count and entry["documents"] == len(common)
        assert entry["ppl"] == pytest.approx(ref, rel=1e-4)
        assert entry["ci_low"] <= entry["ppl"] <= entry["ci_high"]
        # Secondary view: all documents with at least L tokens.
        ref_all, count_all = reference_ppl(model, docs, L)
        assert res["by_length_all"][str(L)]["tokens"] == count_all
        assert res["by_length_all"][str(L)]["ppl"] == pytest.approx(ref_all, rel=1e-4)
    buckets = res["by_bucket"]
    assert [(b["start"], b["end"]) for b in buckets] == [(s, s + 64) for s in range(0, longest, 64)]
    assert buckets[0]["tokens"] == 63 * res["bucket_documents"]
    for b in buckets:
        assert b["ppl"] == pytest.approx(reference_bucket(model, docs, longest, b["start"], b["end"]), rel=1e-4)


def test_one_pass_equals_per_length_for_static(tiny_tokenizer, texts):
    model = tiny_lm(tiny_tokenizer, "linear", target=512)
    lm = loaded(model, tiny_tokenizer)
    kw = dict(lengths=[64, 128, 300], bucket_size=100, short_context=False, resamples=100)
    kw["bucket_size"] = 100
    one = evaluate_perplexity(lm, texts, PerplexitySettings(mode="auto", **kw), show_progress=False)
    per = evaluate_perplexity(lm, texts, PerplexitySettings(mode="per-length", **kw), show_progress=False)
    assert one["mode"] == "one-pass" and per["mode"] == "per-length"
    assert one["forward_passes"] < per["forward_passes"]
    for L in ("64", "128", "300"):
        assert one["by_length"][L]["ppl"] == pytest.approx(per["by_length"][L]["ppl"], rel=1e-5)
    for a, b in zip(one["by_bucket"], per["by_bucket"], strict=True):
        assert a["ppl"] == pytest.approx(b["ppl"], rel=1e-5)


def test_dynamic_uses_per_length_and_matches_fresh_passes(tiny_tokenizer, texts):
    model = tiny_lm(tiny_tokenizer, "dynamic", target=1024)
    lm = loaded(model, tiny_tokenizer)
    lengths = [200, 400, 600]
    res = evaluate_perplexity(
        lm, texts, PerplexitySettings(lengths=lengths, short_context=False, resamples=100), show_progress=False
    )
    assert res["mode"] == "per-length"
    docs = _docs(tiny_tokenizer, texts)
    for L in lengths:
        # A fresh model per length: the reference never sees a longer sequence first.
        ref, _ = reference_ppl(tiny_lm(tiny_tokenizer, "dynamic", target=1024), docs, L)
        assert res["by_length"][str(L)]["ppl"] == pytest.approx(ref, rel=1e-4)
    # The one-pass shortcut would be wrong here: the 400-token prefix of a 600-token pass differs.
    x = torch.tensor(docs[0][:600])[None]
    long_prefix = token_nll(model, x)[0, :399]
    from ctxext.rope.runtime import reset_dynamic_rope

    reset_dynamic_rope(model)
    fresh = token_nll(model, x[:, :400])[0]
    assert not torch.allclose(long_prefix, fresh, atol=1e-4)
    with pytest.raises(InputError, match="depend on the"):
        evaluate_perplexity(lm, texts, PerplexitySettings(lengths=lengths, mode="one-pass"), show_progress=False)


def test_sliding_windows_cover_every_position_once():
    for n, w, s in [(10, 4, 2), (100, 32, 16), (33, 32, 31), (5, 8, 4), (64, 16, 5)]:
        covered = []
        for win in sliding_windows(n, w, s):
            assert win.end - win.begin <= w
            covered.extend(range(win.begin + win.score_from, win.end))
        assert covered == list(range(1, n))


def test_sliding_nll_matches_windowed_reference(tiny_tokenizer, texts):
    model = tiny_lm(tiny_tokenizer)
    ids = torch.tensor(_docs(tiny_tokenizer, texts)[0][:200])
    out = sliding_nll(model, ids, window=64, stride=24, batch_tokens=128)
    for t in (1, 5, 63, 64, 100, 199):
        win = next(w for w in sliding_windows(200, 64, 24) if w.begin + w.score_from <= t < w.end)
        x = ids[win.begin : t + 1][None]
        with torch.no_grad():
            logits = model(x).logits[0, -2]
        ref = -torch.log_softmax(logits.float(), -1)[ids[t]]
        assert float(out[t - 1]) == pytest.approx(float(ref), rel=1e-4, abs=1e-5)


def test_context_use_and_stride_mode(tiny_tokenizer, texts):
    model = tiny_lm(tiny_tokenizer)
    lm = loaded(model, tiny_tokenizer)
    res = evaluate_perplexity(
        lm,
        texts,
        PerplexitySettings(lengths=[128, 256], bucket_size=64, context_limits=[16, 64], resamples=100),
        show_progress=False,
    )
    cu = res["context_use"]
    assert cu["targets"]["start"] == 64 and cu["targets"]["end"] == 256
    assert [e["context"] for e in cu["limits"]] == [16, 64]
    for e in cu["limits"]:
        assert e["gain_nll_ci_low"] <= e["gain_nll"] <= e["gain_nll_ci_high"]
        assert e["ppl_ratio"] == pytest.approx(math.exp(e["gain_nll"]))
    assert res["short_context"]["length"] == 256
    assert res["short_context"]["ppl"] == pytest.approx(res["by_length"]["256"]["ppl"])
    # Stride mode with a window as long as the document equals the truncated protocol.
    short_docs = [t[:3000] for t in texts]
    sl = evaluate_perplexity(
        lm, short_docs, PerplexitySettings(lengths=[128], stride=64, short_context=False), show_progress=False
    )
    assert sl["mode"] == "sliding" and sl["by_bucket"] == []
    assert sl["by_length"]["128"]["tokens"] > 127 * sl["by_length"]["128"]["documents"]


def test_clear_errors(tiny_tokenizer, texts):
    lm = loaded(tiny_lm(tiny_tokenizer), tiny_tokenizer)
    with pytest.raises(InputError, match="addresses 256 tokens"):
        evaluate_perplexity(lm, texts, PerplexitySettings(lengths=[512]), show_progress=False)
    with pytest.raises(InputError, match="does not divide"):
        evaluate_perplexity(lm, texts, PerplexitySettings(lengths=[256], bucket_size=100), show_progress=False)
    with pytest.raises(InputError, match=r"0 document\(s\) reach 200 tokens.*6 read, 6 shorter"):
        evaluate_perplexity(lm, ["x = 1\n"] * 6, PerplexitySettings(lengths=[200]), show_progress=False)
    beyond = evaluate_perplexity(
        lm, texts, PerplexitySettings(lengths=[300], allow_beyond_context=True, resamples=50), show_progress=False
    )
    assert beyond["by_length"]["300"]["beyond_context"] is True


def test_common_document_set_and_minimum(tiny_tokenizer, texts):
    lm = loaded(tiny_lm(tiny_tokenizer), tiny_tokenizer)
    short = [t[:200] for t in texts[:4]]  # documents that reach 64 but not 200 tokens
    mixed = short + list(texts)
    res = evaluate_perplexity(
        lm, mixed, PerplexitySettings(lengths=[64, 200], max_docs=3, resamples=50), show_progress=False
    )
    # max_docs counts documents reaching the longest length; the short ones only enter the secondary view.
    assert res["by_length"]["64"]["documents"] == res["by_length"]["200"]["documents"] == 3
    n_short = [len(d) for d in _docs(tiny_tokenizer, short)]
    assert max(n_short) < 200
    expected = 3 + sum(n >= 64 for n in n_short)
    assert res["by_length_all"]["64"]["documents"] == expected > 3 and res["by_length_all"]["200"]["documents"] == 3
    keys = res["per_document"]["keys"]
    assert len(keys) == expected and len(set(keys)) == expected
    with pytest.raises(InputError, match=r"1 document\(s\) reach 200 tokens.*3 needed.*builtin:stdlib-long"):
        evaluate_perplexity(lm, short + texts[:1], PerplexitySettings(lengths=[64, 200]), show_progress=False)
    one = evaluate_perplexity(
        lm, texts[:1], PerplexitySettings(lengths=[64], min_docs=1, resamples=50), show_progress=False
    )
    assert one["by_length"]["64"]["documents"] == 1


def test_longrope_scores_each_length_in_its_own_pass(tiny_tokenizer, texts):
    # head_dim 16 -> 8 rotary frequency pairs; long factors interpolate, short factors keep.
    opts = {"short_factor": [1.0] * 8, "long_factor": [1.0 + i for i in range(8)]}
    from ctxext.rope.runtime import patch_model
    from tests.helpers.tiny import tiny_model

    def fresh():
        m = tiny_model("llama", seed=0, vocab_size=len(tiny_tokenizer))
        patch_model(m, "longrope", 1024, opts)
        return m

    model = fresh()
    lm = loaded(model, tiny_tokenizer)
    res = evaluate_perplexity(
        lm, texts, PerplexitySettings(lengths=[128, 400], short_context=False, resamples=50), show_progress=False
    )
    assert res["mode"] == "per-length"
    docs = _docs(tiny_tokenizer, texts)
    for L in (128, 400):
        ref, _ = reference_ppl(fresh(), docs, L)
        assert res["by_length"][str(L)]["ppl"] == pytest.approx(ref, rel=1e-4)
    # A 128-token prefix of a 400-token pass uses the long factors: the shortcut would be wrong.
    x = torch.tensor(docs[0][:400])[None]
    assert not torch.allclose(token_nll(fresh(), x)[0, :127], token_nll(fresh(), x[:, :128])[0], atol=1e-4)


def test_stdlib_long_joins_heldout_files_into_long_documents():
    from ctxext.models.builtin import stdlib_source_files
    from ctxext.scoring.texts import LONG_DOC_CHARS, iter_texts

    docs = list(iter_texts("builtin:stdlib-long"))
    assert len(docs) >= 3
    assert all(len(d) >= LONG_DOC_CHARS for d in docs[:-1])
    files = stdlib_source_files("stdlib-heldout", default_split="heldout")
    assert sum(d.count("\n# ---- ") + d.startswith("# ---- ") for d in docs) == len(files)
