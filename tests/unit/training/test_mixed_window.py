"""Mixed context-window training (LongRoPE2) under length-dependent RoPE: short rows run the short regime.

transformers 5.24 picks ``longrope``'s factors and ``dynamic``'s scaling from the largest position id of the
whole micro-batch, so a short row batched with a long row would run the long-context frequencies.
"""

from __future__ import annotations

import pytest
import torch

from ctxext.rope.runtime import patch_model, rotary_modules
from ctxext.training.data.rows import build_inputs
from ctxext.training.steps import CausalLMWithChunkedLoss, micro_batches, short_rows
from tests.helpers.tiny import tiny_model

WINDOW, TARGET, SEQ = 32, 128, 64
D = 16  # head_dim of the tiny models
LONGROPE = {"short_factor": [1.0 + 0.1 * i for i in range(D // 2)], "long_factor": [1.0 + i for i in range(D // 2)]}


def _model(method: str):
    model = tiny_model(max_position_embeddings=WINDOW)
    patch_model(model, method, TARGET, LONGROPE if method == "longrope" else {})
    return model


def _rows(n_short: int = 4, n_long: int = 4) -> dict[str, torch.Tensor]:
    """Short rows: two 32-token documents (positions 0..31 each). Long rows: one 64-token document."""
    torch.manual_seed(0)
    short = torch.tensor([0] * WINDOW + [1] * WINDOW)
    long = torch.zeros(SEQ, dtype=torch.long)
    # Interleaved, so a plain order puts short and long rows together.
    segments = torch.stack([short if i % 2 == 0 else long for i in range(n_short + n_long)])
    return {"input_ids": torch.randint(0, 512, (n_short + n_long, SEQ)), "segments": segments}


def _dataset(rows: dict[str, torch.Tensor]):
    """The rows as training holds them: a torch-formatted ``datasets.Dataset``."""
    import datasets

    ds = datasets.Dataset.from_dict({k: v.tolist() for k, v in rows.items()})
    ds.set_format("torch", columns=list(rows))
    return ds


def _take(rows: dict[str, torch.Tensor], idx: list[int]) -> dict[str, torch.Tensor]:
    return {k: v[idx] for k, v in rows.items()}


def _logits(model, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    inputs = build_inputs(rows, attn_implementation="sdpa")
    with torch.no_grad():
        return model(
            input_ids=inputs.input_ids,
            position_ids=inputs.position_ids,
            attention_mask=inputs.attention_mask,
            use_cache=False,
        ).logits


def test_short_rows_and_grouped_order_is_deterministic_resumable_and_never_mixed():
    rows = _rows(6, 6)
    flags = short_rows(rows_dataset := _dataset(rows), _model("longrope"))
    assert flags == [i % 2 == 0 for i in range(12)]
    assert short_rows(rows_dataset, tiny_model()) is None  # static RoPE: no grouping
    first = micro_batches(12, 2, 1, 0, seed=5, short=flags)
    order = [next(first) for _ in range(12)]  # two epochs
    assert all(len({flags[i] for i in b}) == 1 for b in order)
    assert sorted(i for b in order[:6] for i in b) == list(range(12))  # an epoch visits every row once
    assert order[6:] != order[:6]  # the next epoch reshuffles
    resumed = micro_batches(12, 2, 1, 0, seed=5, start=4, short=flags)
    assert [next(resumed) for _ in range(8)] == order[4:]
    # Two processes: each gets whole, unmixed micro-batches, together every row once per epoch.
    ranks = [micro_batches(12, 2, 2, r, seed=5, short=flags) for r in (0, 1)]
    per_rank = [[next(it) for _ in range(3)] for it in ranks]
    assert sorted(i for r in per_rank for b in r for i in b) == list(range(12))
    assert all(len({flags[i] for i in b}) == 1 for r in per_rank for b in r)
    # Without flags the order is the plain one, which does mix (the reason for grouping).
    plain = micro_batches(12, 2, 1, 0, seed=5)
    assert any(len({flags[i] for i in next(plain)}) == 2 for _ in range(6))


def test_longrope_short_row_in_a_mixed_run_equals_the_row_alone_in_the_short_regime():
    model = _model("longrope")
    rotary = next(m for _, m in rotary_modules(model))
    rows = _rows()
    flags = short_rows(_dataset(rows), model)
    batches = micro_batches(8, 2, 1, 0, seed=1, short=flags)
    for _ in range(4):  # one epoch: long and short micro-batches interleaved
        idx = next(batches)
        got = _logits(model, _take(rows, idx))
        long_regime = torch.equal(rotary.inv_freq, rotary.long_inv_freq)
        assert long_regime != flags[idx[0]]
        for j, r in enumerate(idx):
            if flags[r]:
                alone = _logits(model, _take(rows, [r]))
                assert torch.equal(rotary.inv_freq, rotary.original_inv_freq)  # alone: the short factors
                torch.testing.assert_close(got[j], alone[0], atol=1e-5, rtol=1e-5)
    # The control: batched with a long row, the same short row runs the long factors and its logits change.
    mixed = _logits(model, _take(rows, [0, 1]))
    assert not torch.allclose(mixed[0], _logits(model, _take(rows, [0]))[0], atol=1e-3)


def _lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))


def _loss(wrapper, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    inputs = build_inputs(rows, attn_implementation="sdpa")
    with torch.no_grad():
        total, count = wrapper(inputs.input_ids, inputs.labels, inputs.position_ids, inputs.attention_mask)
    return total / count


@pytest.mark.parametrize("method", ["dynamic", "longrope"])
def test_a_short_micro_batch_after_a_long_one_runs_as_on_a_fresh_model(method):
    rows = _rows()
    short, long = _take(rows, [0, 2]), _take(rows, [1, 3])
    fresh = _loss(CausalLMWithChunkedLoss(_lora(_model(method)), 64), short)
    wrapper = CausalLMWithChunkedLoss(_lora(_model(method)), 64)
    rotary = next(m for _, m in rotary_modules(wrapper))
    assert wrapper.reset_rope
    _loss(wrapper, long)
    assert not torch.equal(rotary.inv_freq, rotary.original_inv_freq)  # the long regime ran
    torch.testing.assert_close(_loss(wrapper, short), fresh, atol=1e-6, rtol=1e-6)
    assert torch.equal(rotary.inv_freq, rotary.original_inv_freq)  # and the short rows ran the short one
    if method == "dynamic":
        # Without the reset, dynamic NTK keeps the long pass's frequencies for the short rows: their largest
        # position + 1 equals the original window, which transformers' own reset (below it only) misses.
        wrapper.reset_rope = False
        _loss(wrapper, long)
        _loss(wrapper, short)
        assert not torch.equal(rotary.inv_freq, rotary.original_inv_freq)


def test_mixture_short_rows_fill_whole_micro_batches_under_length_dependent_rope(tiny_tokenizer):
    from types import SimpleNamespace

    from ctxext.recipe.schema import parse_recipe
    from ctxext.training.data.mixture import prepare_training_data

    recipe = parse_recipe(
        {
            "model": {"path": "builtin:tiny-llama"},
            "rope": {"method": "longrope", "target_length": 512, **LONGROPE},
            "data": {
                "mixture": [{"path": "builtin:stdlib", "weight": 1, "max_documents": 8}],
                "short_fraction": 0.25,
                "num_proc": 1,
            },
            "train": {"seq_len": 512, "micro_batch_size": 4},
        }
    )
    counts = {}
    for rope_type in ("longrope", "yarn"):
        plan = SimpleNamespace(original_length=256, target_length=512, rope_parameters={"rope_type": rope_type})
        data = prepare_training_data(recipe, tiny_tokenizer, plan, rows=12)
        counts[rope_type] = sum(s["rows"] for s in data.mixture["realised"]["sources"] if s["source"][:6] == "short:")
    assert counts == {"longrope": 4, "yarn": 3}


def test_a_longrope_run_trains_short_and_long_rows_in_separate_micro_batches(tmp_path, cache_root, monkeypatch):
    import json

    from ctxext.recipe.schema import load_recipe
    from ctxext.training.loop import AUDIT_ENV
    from ctxext.training.run import read_run, train
    from tests.helpers.train import write_recipe

    monkeypatch.setenv(AUDIT_ENV, str(tmp_path / "audit"))
    recipe = load_recipe(
        write_recipe(
            tmp_path / "r.yaml",
            tmp_path / "run",
            rope={"method": "longrope", "target_length": 512, **LONGROPE},
            data={"short_fraction": 0.5},
            train={"seq_len": 512, "micro_batch_size": 2, "max_steps": 3},
        )
    )
    run = read_run(train(recipe).run_dir)
    assert run.status == "complete"
    # 6 rows, the short ones last: round(6 × 0.5) = 3, rounded to whole micro-batches of 2. Under the plain
    # order (seed 42: [0, 3], [2, 4], [1, 5]) two of the three micro-batches would mix them.
    blocks = json.loads((tmp_path / "audit" / "rank-0.json").read_text())["blocks"]
    mixture = json.loads((tmp_path / "run" / "mixture.json").read_text())["realised"]
    n_short = sum(s["rows"] for s in mixture["sources"] if s["source"].startswith("short:"))
    first_short = mixture["rows"] - n_short
    assert n_short % 2 == 0 and 0 < n_short < mixture["rows"]
    pairs = [blocks[i : i + 2] for i in range(0, len(blocks), 2)]
    assert all(len({b >= first_short for b in pair}) == 1 for pair in pairs), pairs
