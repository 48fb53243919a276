"""PoSE position ids, document-boundary masking and the recipe checks that guard them."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from ctxext.recipe.schema import RecipeError, parse_recipe
from ctxext.training.data.pose import example_generator, pose_position_ids
from ctxext.training.data.rows import block_causal_mask, build_inputs, segment_positions


def test_pose_positions_monotone_from_zero_below_target_and_cover_distances():
    seq, target = 64, 512
    reached = torch.zeros(target, dtype=torch.bool)
    for k in range(400):
        pos = pose_position_ids(seq, target, 2, example_generator(0, k))
        assert pos.shape == (seq,) and pos[0] == 0
        assert bool((pos[1:] > pos[:-1]).all())  # strictly increasing
        assert int(pos.max()) < target
        dist = (pos.unsqueeze(0) - pos.unsqueeze(1)).flatten()
        reached[dist[dist >= 0]] = True
    # Over many examples every relative distance up to target-1 is seen (the near-top ones included).
    assert bool(reached.all()), torch.nonzero(~reached).flatten()[:10]


def test_pose_is_a_function_of_seed_and_example():
    a = pose_position_ids(32, 256, 3, example_generator(7, 11))
    b = pose_position_ids(32, 256, 3, example_generator(7, 11))
    c = pose_position_ids(32, 256, 3, example_generator(7, 12))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert len(torch.unique(a[1:] - a[:-1])) <= 3  # two skips at most, the rest steps of 1


def test_segment_positions_and_block_mask():
    seg = torch.tensor([[0, 0, 0, 1, 1, 2]])
    assert segment_positions(seg).tolist() == [[0, 1, 2, 0, 1, 0]]
    mask = block_causal_mask(seg)[0, 0]
    assert mask[4].tolist() == [False, False, False, True, True, False]
    assert mask[2].tolist() == [True, True, True, False, False, False]


def test_packed_documents_with_mask_equal_each_document_alone():
    model = tiny_model()
    torch.manual_seed(0)
    docs = [torch.randint(0, 512, (n,)) for n in (20, 7, 37)]
    ids = torch.cat(docs).unsqueeze(0)
    seg = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)]).unsqueeze(0)
    inputs = build_inputs({"input_ids": ids, "segments": seg}, attn_implementation="sdpa")
    with torch.no_grad():
        packed = model(
            input_ids=inputs.input_ids,
            position_ids=inputs.position_ids,
            attention_mask=inputs.attention_mask,
            use_cache=False,
        ).logits[0]
        alone = torch.cat([model(input_ids=d.unsqueeze(0)).logits[0] for d in docs])
        unmasked = model(input_ids=ids).logits[0]
    torch.testing.assert_close(packed, alone, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(unmasked[20:], alone[20:], atol=1e-3)  # without the mask they would differ
    # No label crosses a document boundary; the rest are next tokens.
    labels = inputs.labels[0]
    assert labels[19] == -100 and labels[26] == -100 and labels[-1] == -100
    assert labels[:19].tolist() == ids[0, 1:20].tolist()


def test_pose_row_attends_across_its_skip():
    # With attention_mask=None transformers would read a position jump as a new packed sequence; the
    # explicit mask keeps the row one sequence: logits equal a plain forward with the same positions.
    model = tiny_model()
    ids = torch.randint(0, 512, (2, 32))
    inputs = build_inputs({"input_ids": ids}, attn_implementation="sdpa", target_length=256, pose_chunks=2, seed=1)
    pos = inputs.position_ids
    assert bool((pos[:, 1:] - pos[:, :-1] > 1).any())
    full = torch.zeros(2, 1, 32, 32, dtype=torch.bool) | torch.ones(32, 32, dtype=torch.bool).tril()
    with torch.no_grad():
        ours = model(input_ids=ids, position_ids=pos, attention_mask=inputs.attention_mask, use_cache=False).logits
        causal = model(input_ids=ids, position_ids=pos, attention_mask=full, use_cache=False).logits
        # Without a cache (training), transformers reads the jump as a packed-sequence boundary.
        cut = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(ours, causal)
    assert not torch.allclose(ours, cut, atol=1e-3)


def test_answer_only_targets():
    ids = torch.arange(10).unsqueeze(0)
    targets = torch.tensor([[0] * 7 + [1] * 3])
    inputs = build_inputs({"input_ids": ids, "targets": targets}, attn_implementation="sdpa")
    assert inputs.labels[0].tolist() == [-100] * 6 + [7, 8, 9, -100]
    assert inputs.position_ids is None and inputs.attention_mask is None


BASE = {
    "model": {"path": "builtin:tiny-llama"},
    "rope": {"method": "yarn", "target_length": 1024},
    "data": {"path": "builtin:stdlib"},
    "train": {"seq_len": 256, "pose": {"chunks": 2}},
}


def _with(**changes):
    data = {k: dict(v) for k, v in BASE.items()}
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        data[section][key] = value
    return data


@pytest.mark.parametrize("method", ["dynamic", "longrope"])
def test_pose_refused_for_length_dependent_methods(method):
    with pytest.raises(RecipeError) as err:
        parse_recipe(_with(rope__method=method))
    (key, msg), *_ = err.value.problems
    assert key == "train.pose" and method in msg and "frequencies depend" in msg


def test_pose_needs_room_to_skip_and_valid_chunks():
    assert parse_recipe(_with()).train.pose.chunks == 2
    with pytest.raises(RecipeError, match="nothing to skip"):
        parse_recipe(_with(train__seq_len=1024))
    with pytest.raises(RecipeError) as err:
        parse_recipe(_with(train__pose={"chunks": 1}))
    assert err.value.problems[0][0] == "train.pose.chunks"
