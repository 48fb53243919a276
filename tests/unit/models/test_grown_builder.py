"""The grown-model builder (``ctxext.models.grown``, what ``python -m benchmarks.grow_base`` runs) on a tiny recipe.

The packaged models took tens of minutes to grow; here the same code path (split, tokenizer, stage 1 and
stage 2 with needles, repeats and multi-key windows under the answer loss, atomic save) runs a few steps on
six stdlib files and a one-layer model, and the folder it writes must load and score text.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ctxext.errors import InputError
from ctxext.models.grown import GrowSettings, Needles, TrainingSequences, encode, grow, split_files

TINY = dict(
    vocab_size=320,
    hidden=32,
    intermediate=64,
    layers=1,
    heads=2,
    steps=3,
    batch=4,
    warmup=1,
    log_every=1,
    eval_every=2,
    multikey_share=0.3,
    answer_weight=1.0,
    stage2_steps=2,
    stage2_warmup=1,
)


@pytest.fixture(scope="module")
def few_files():
    root, train, heldout = split_files(10)
    # Small files keep tokenizer training and encoding to a fraction of a second.
    small = sorted((p for p in train if 2_000 < p.stat().st_size < 8_000), key=lambda p: p.as_posix())
    return root, small[:5], [p for p in heldout if 2_000 < p.stat().st_size < 20_000][:2]


@pytest.fixture(scope="module")
def grown(tmp_path_factory, few_files):
    out = tmp_path_factory.mktemp("grown") / "g"
    lines: list[str] = []

    def files(last: GrowSettings, report: dict) -> dict[str, str]:
        return {"grow_report.json": json.dumps({**report, "steps": last.steps})}

    s, report = grow(GrowSettings(**TINY), out, lines.append, split=few_files, report_files=files)
    return out, s, report, lines


def test_builder_writes_a_folder_that_loads_and_scores_text(grown, few_files):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, s, report, lines = grown
    for name in ("config.json", "model.safetensors", "tokenizer.json", "heldout_files.txt", "grow_report.json"):
        assert (out / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.max_position_embeddings == 64 and model.config.num_hidden_layers == 1
    assert len(tok) == model.config.vocab_size <= 320
    ids = tok("def f(x):\n    return x\n", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        loss = float(model(input_ids=ids, labels=ids).loss)
    assert math.isfinite(loss)
    root, _, heldout = few_files
    assert (out / "heldout_files.txt").read_text().split() == [p.relative_to(root).as_posix() for p in heldout]


def test_builder_runs_both_stages_and_records_them(grown):
    out, s, report, lines = grown
    assert s.steps == 2 and s.needle_share == 0.5 and s.seed == 1  # the last stage is stage 2
    (stage1,) = report["earlier_stages"]
    assert stage1["settings"]["steps"] == 3 and len(stage1["training"]["history"]) == 3
    history = report["training"]["history"]
    assert [h["step"] for h in history] == [1, 2] and "heldout_loss_plain" in history[-1]
    assert report["training"]["tokens_seen"] == 2 * 4 * 64
    assert json.loads((out / "grow_report.json").read_text())["steps"] == 2
    assert any(line.startswith("stage 2") for line in lines)


def test_builder_replaces_its_own_folder_but_not_another(grown, few_files, tmp_path):
    out, *_ = grown
    again = GrowSettings(**{**TINY, "steps": 1, "stage2_steps": 0})
    s, report = grow(again, out, lambda _: None, split=few_files)
    assert "earlier_stages" not in report and (out / "model.safetensors").is_file()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    lines: list[str] = []
    with pytest.raises(InputError, match="mine"):
        grow(again, foreign, lines.append, split=few_files)
    assert lines == []  # refused before any work
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_training_windows_hold_the_needle_and_the_asked_key(grown):
    from transformers import AutoTokenizer

    out, s, *_ = grown
    tok = AutoTokenizer.from_pretrained(out)
    stream = np.asarray(encode(tok, "x = 1\ny = 2\n" * 200), dtype=np.int64)
    windows = TrainingSequences(stream, Needles(tok), s, seed=3)
    seq = windows.needle_sequence()
    assert len(seq) == 64 and "assert KEY_" in tok.decode(seq.tolist())
    seq, (a0, a1) = windows.multikey_sequence(count=2)
    text = tok.decode(seq.tolist())
    asked = text.split("assert ")[1].split(" ==")[0]
    assert len(seq) == 64 and text.count("KEY_") == 3
    assert f"{asked} = {tok.decode(seq[a0:a1].tolist()).strip()}\n" in text
