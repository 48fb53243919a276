"""Exact masking for every attention implementation the CPU runs (sdpa, eager).

The training rows' mask (:func:`ctxext.training.data.rows.build_inputs`) reaches the model as it is; each
backend must see it in its own form. These tests check what the model computes with it: causality,
packed documents equal to the same documents alone, and eager equal to SDPA.
"""

from __future__ import annotations

import pytest
import torch

from ctxext.training.data.rows import IGNORE_INDEX, build_inputs
from tests.helpers.tiny import tiny_config

IMPLEMENTATIONS = ("sdpa", "eager")
# Three packed documents in one 64-token row (the last one ends the row).
DOC_LENGTHS = (20, 7, 37)


def model_for(impl: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)  # the same weights for every implementation
    return AutoModelForCausalLM.from_config(tiny_config(), attn_implementation=impl).eval()


def packed_row(seed: int = 1) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, 512, (n,), generator=gen) for n in DOC_LENGTHS]
    ids = torch.cat(docs).unsqueeze(0)
    seg = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)]).unsqueeze(0)
    return docs, ids, seg


def forward(model, rows: dict[str, torch.Tensor], impl: str, **pose) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and per-token losses (0 where unscored) of a micro-batch, the way training builds it."""
    inputs = build_inputs(rows, attn_implementation=impl, **pose)
    with torch.no_grad():
        logits = model(
            input_ids=inputs.input_ids,
            position_ids=inputs.position_ids,
            attention_mask=inputs.attention_mask,
            use_cache=False,
        ).logits
    loss = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), inputs.labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    )
    return logits, loss.view(inputs.labels.shape)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("kind", ["segments", "pose"])
def test_later_tokens_do_not_change_earlier_logits(impl, kind):
    model = model_for(impl)
    _, ids, seg = packed_row()
    changed = ids.clone()
    changed[0, 60:] = (changed[0, 60:] + 1) % 512
    if kind == "segments":
        rows, pose = ({"input_ids": ids, "segments": seg}, {"input_ids": changed, "segments": seg}), {}
    else:  # one document, PoSE positions: the 2D-mask path
        rows, pose = ({"input_ids": ids}, {"input_ids": changed}), {"target_length": 256, "pose_chunks": 2, "seed": 3}
    before, _ = forward(model, rows[0], impl, **pose)
    after, _ = forward(model, rows[1], impl, **pose)
    assert float((before[0, :60] - after[0, :60]).abs().max()) <= 1e-6
    assert float((before[0, 60:] - after[0, 60:]).abs().max()) > 1e-3  # the change itself is seen


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_packed_document_loss_equals_the_document_alone(impl):
    model = model_for(impl)
    docs, ids, seg = packed_row()
    _, packed = forward(model, {"input_ids": ids, "segments": seg}, impl)
    start = 0
    for doc in docs:
        _, alone = forward(model, {"input_ids": doc.unsqueeze(0)}, impl)
        # The last token of a packed document is not trained (it would predict the next document).
        n = len(doc) - 1
        torch.testing.assert_close(packed[0, start : start + n], alone[0, :n], rtol=1e-5, atol=0)
        start += len(doc)


def test_eager_and_sdpa_give_the_same_per_token_loss_on_packed_rows():
    _, ids, seg = packed_row()
    gen = torch.Generator().manual_seed(2)
    # Two rows: the packed one, and one cut into other documents.
    ids2 = torch.cat([ids, torch.randint(0, 512, ids.shape, generator=gen)])
    seg2 = torch.cat([seg, torch.tensor([[0] * 10 + [1] * 30 + [2] * 24])])
    rows = {"input_ids": ids2, "segments": seg2}
    _, sdpa = forward(model_for("sdpa"), rows, "sdpa")
    _, eager = forward(model_for("eager"), rows, "eager")
    assert int((sdpa > 0).sum()) == 2 * 64 - 6  # every row's last token and 4 document ends are unscored
    torch.testing.assert_close(eager, sdpa, rtol=1e-5, atol=0)


def test_training_wrapper_loss_is_the_same_under_eager_and_sdpa():
    # The loss training backpropagates (the chunked loss over the peft model) under both backends.
    from peft import LoraConfig, get_peft_model

    from ctxext.training.steps import CausalLMWithChunkedLoss

    _, ids, seg = packed_row()
    totals = {}
    for impl in IMPLEMENTATIONS:
        peft_model = get_peft_model(model_for(impl), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        inputs = build_inputs({"input_ids": ids, "segments": seg}, attn_implementation=impl)
        with torch.no_grad():
            total, count = CausalLMWithChunkedLoss(peft_model, chunk_size=16)(
                inputs.input_ids, inputs.labels, inputs.position_ids, inputs.attention_mask
            )
        totals[impl] = (float(total), int(count))
    assert totals["eager"][1] == totals["sdpa"][1] == 64 - 3
    assert totals["eager"][0] == pytest.approx(totals["sdpa"][0], rel=1e-5)


def test_eager_mask_is_additive():
    _, ids, seg = packed_row()
    mask = build_inputs({"input_ids": ids, "segments": seg}, attn_implementation="eager").attention_mask
    assert mask is not None and mask.dtype == torch.float32
    assert float(mask[0, 0, 25, 22]) == 0.0  # same document, earlier token
    assert float(mask[0, 0, 25, 5]) == torch.finfo(torch.float32).min  # an earlier document
    assert float(mask[0, 0, 5, 6]) == torch.finfo(torch.float32).min  # the future
