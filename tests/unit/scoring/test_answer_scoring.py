"""Teacher-forced answer scoring equals greedy decoding, batches like one-at-a-time, and has no KV-cache bug."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from ctxext.errors import InputError
from ctxext.models.builtin import GROWN_DIR
from ctxext.rope.runtime import patch_model, reset_dynamic_rope
from ctxext.scoring.answers import answer_only_last_layer, score_answers
from tests.helpers.tiny import tiny_model


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    # Plain greedy loop without cache: the reference the scorer must match.
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            reset_dynamic_rope(model)
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def test_equals_greedy_generation_static_rope():
    model = tiny_model("llama", seed=1)
    rng = random.Random(0)
    seqs, spans, expect = [], [], []
    for length in (12, 12, 12, 20, 31):
        prompt = [rng.randrange(512) for _ in range(length)]
        answer = _greedy(model, prompt, 4)
        seqs.append(prompt + answer)
        spans.append((length, length + 4))
        expect.append(True)
        # The same answer with its third token changed to a non-argmax token: not what greedy produces.
        wrong = list(answer)
        wrong[2] = (wrong[2] + 1) % 512
        seqs.append(prompt + wrong)
        spans.append((length, length + 4))
        expect.append(False)
    # Cross-check the greedy loop with generate() (no sampling, no cache) on one prompt.
    gen = model.generate(
        input_ids=torch.tensor([seqs[0][:12]]), max_new_tokens=4, do_sample=False, use_cache=False, pad_token_id=0
    )
    assert gen[0, 12:].tolist() == seqs[0][12:]
    scores = score_answers(model, seqs, spans, batch_tokens=40)
    assert [s.correct for s in scores] == expect
    assert all(s.n_tokens == 4 for s in scores)
    # NLL equals the full-logits cross-entropy of the answer tokens.
    for seq, (a, b), s in zip(seqs, spans, scores, strict=True):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq])).logits[0].float()
        ref = F.cross_entropy(logits[a - 1 : b - 1], torch.tensor(seq[a:b]), reduction="sum")
        assert s.nll == pytest.approx(float(ref), rel=1e-4)
    # Batched (any batch size) == one at a time.
    singles = [score_answers(model, [q], [sp])[0] for q, sp in zip(seqs, spans, strict=True)]
    assert [s.correct for s in singles] == expect
    assert [s.nll for s in singles] == pytest.approx([s.nll for s in scores], rel=1e-5)


def test_peft_wrapped_model():
    from peft import LoraConfig, get_peft_model

    model = tiny_model("llama", seed=2)
    prompt = list(range(5, 25))
    answer = _greedy(model, prompt, 3)
    wrapped = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).eval()
    (s,) = score_answers(wrapped, [prompt + answer], [(20, 23)])
    assert s.correct and s.n_tokens == 3


def test_dynamic_rope_independent_of_order():
    # Dynamic NTK keeps the frequencies of the longest sequence seen; the scorer resets before each pass,
    # so a short sequence scores the same after a long one as alone.
    model = tiny_model("llama", seed=3, max_position_embeddings=32)
    patch_model(model, "dynamic", 128)
    rng = random.Random(1)
    short = [rng.randrange(512) for _ in range(48)]
    long = [rng.randrange(512) for _ in range(120)]
    alone = score_answers(model, [short], [(40, 48)])[0]
    both = score_answers(model, [long, short], [(100, 120), (40, 48)])
    assert both[1].nll == pytest.approx(alone.nll, rel=1e-6)


@pytest.mark.parametrize(
    ("kind", "method", "overrides"),
    [
        ("llama", None, {}),
        ("llama", "yarn", {"max_position_embeddings": 32}),
        ("llama", "dynamic", {"max_position_embeddings": 32}),
        ("mistral", None, {"sliding_window": None}),
        ("qwen2", None, {}),
    ],
)
def test_answer_only_last_layer_equals_full_pass(kind, method, overrides):
    # The final layer at the answer positions only (keys / values everywhere) gives the full pass's scores,
    # for answers of different lengths in one batch (the window starts at the earliest answer).
    model = tiny_model(kind, seed=4, **overrides)
    if method:
        patch_model(model, method, 128)
    assert answer_only_last_layer(model.model, 64) is not None
    rng = random.Random(2)
    seqs = [[rng.randrange(512) for _ in range(64)] for _ in range(6)]
    spans = [(60, 64), (55, 64), (63, 64), (40, 64), (62, 64), (1, 64)]
    fast = score_answers(model, seqs, spans, answer_only=True)
    full = score_answers(model, seqs, spans, answer_only=False)
    assert [s.correct for s in fast] == [s.correct for s in full]
    assert [s.nll for s in fast] == pytest.approx([s.nll for s in full], rel=1e-5, abs=1e-4)


def test_answer_only_last_layer_falls_back():
    # A sliding window shorter than the sequence: the layer is not Llama-like there, so the full pass runs.
    model = tiny_model("mistral", seed=5, sliding_window=16)
    assert answer_only_last_layer(model.model, 64) is None
    assert answer_only_last_layer(model.model, 16) is not None
    seq = list(range(3, 67))
    (fast,) = score_answers(model, [seq], [(60, 64)], answer_only=True)
    (full,) = score_answers(model, [seq], [(60, 64)], answer_only=False)
    assert fast.nll == full.nll


def test_bad_spans():
    model = tiny_model("llama", seed=0)
    with pytest.raises(InputError, match="answer span"):
        score_answers(model, [[1, 2, 3]], [(0, 2)])
    with pytest.raises(InputError, match="answer span"):
        score_answers(model, [[1, 2, 3]], [(2, 5)])
    with pytest.raises(InputError, match="one span per sequence"):
        score_answers(model, [[1, 2, 3]], [])


@pytest.mark.skipif(not (GROWN_DIR / "model.safetensors").is_file(), reason="the grown model is not packaged")
@pytest.mark.parametrize("method", ["dynamic", "longrope"])
def test_length_dependent_rope_no_kv_cache_bug(cache_root, method):
    """Dynamic / longrope ×4 retrieve in-window at the base's level when scored teacher-forced.

    Generation with a KV cache gets 6/30 (dynamic) and 0/30 (longrope) on this grid (issue 10).
    """
    from ctxext.evaluation.sections.grids.engine import GridSettings, NeedleTask, evaluate_needle
    from ctxext.models.load import ModelSpec, load_model

    torch.set_num_threads(1)
    lm = load_model(ModelSpec("builtin:grown-code-64"))
    # longrope: short factors 1 (the original rotation in-window), long factors 4 (interpolation past it).
    options = {"short_factor": [1.0] * 32, "long_factor": [4.0] * 32} if method == "longrope" else None
    patch_model(lm.model, method, 256, options)
    from ctxext.rope.read import read_rope

    lm.rope = read_rope(lm.model.config)
    task = NeedleTask(needle="\nKEY_{name} = {key}\n", question="\nassert KEY_{name} ==", answer="{key}")
    res = evaluate_needle(lm, GridSettings(lengths=[64], depths=[10, 50, 90], trials=10), task, show_progress=False)
    assert res["scoring"] == "teacher-forced"
    assert res["overall"]["accuracy"] >= 0.95


@pytest.mark.skipif(not (GROWN_DIR / "model.safetensors").is_file(), reason="the grown model is not packaged")
def test_checkpoint_generation_config_changes_no_retrieval_number(cache_root, tmp_path):
    """A repetition penalty in generation_config.json leaves both scorings unchanged (it cost 18/18 → 11/18)."""
    import json
    import shutil

    from ctxext.evaluation.sections.grids.engine import GridSettings, NeedleTask, evaluate_needle
    from ctxext.models.load import ModelSpec, load_model
    from ctxext.models.sources import resolve_model_path

    torch.set_num_threads(1)
    src = resolve_model_path("builtin:grown-code-64")
    penalized = tmp_path / "penalized"
    shutil.copytree(src, penalized)
    gen_file = penalized / "generation_config.json"
    gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
    gen["repetition_penalty"] = 1.3
    gen_file.write_text(json.dumps(gen))
    task = NeedleTask(needle="\nKEY_{name} = {key}\n", question="\nassert KEY_{name} ==", answer="{key}")
    outcomes = {}
    for label, ref in (("plain", str(src)), ("penalized", str(penalized))):
        lm = load_model(ModelSpec(ref))
        assert (lm.model.generation_config.repetition_penalty == 1.3) == (label == "penalized")
        for scoring in ("teacher-forced", "generate"):
            grid = GridSettings(lengths=[64], depths=[10, 50, 90], trials=6, scoring=scoring)
            res = evaluate_needle(lm, grid, task, show_progress=False)
            outcomes[label, scoring] = [c["outcomes"] for c in res["cells"]]
        assert lm.model.generation_config.repetition_penalty == (1.3 if label == "penalized" else None)
    assert outcomes["plain", "teacher-forced"] == outcomes["penalized", "teacher-forced"]
    assert outcomes["plain", "generate"] == outcomes["penalized", "generate"]
    assert outcomes["plain", "generate"] == outcomes["plain", "teacher-forced"]
    assert sum(map(sum, outcomes["plain", "generate"])) >= 15  # the grown model retrieves in-window
