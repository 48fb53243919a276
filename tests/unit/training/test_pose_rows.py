"""PoSE position ids, document-boundary masking and the recipe checks that guard them."""

from __future__ import annotations

import pytest
import torch

from ctxext.recipe.schema import RecipeError, parse_recipe
from ctxext.training.data.pose import (
    example_generator,
    keyed_generator,
    official_pose,
    official_pose_row,
    pose_position_ids,
)
from ctxext.training.data.rows import block_causal_mask, build_inputs, segment_positions
from tests.helpers.tiny import tiny_model


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


# --- the official sampling (github.com/dwzhu-pku/PoSE, train_preprocess_function_pose) -----------------


def _chunks(take: list[int], pos: list[int]) -> tuple[int, int, int]:
    """(first chunk length, content skip, position skip) of an official row; 1 for a row with no skip at all."""
    jumps = (j for j in range(1, len(take)) if take[j] != take[j - 1] + 1 or pos[j] != pos[j - 1] + 1)
    first = next(jumps, 1)
    return first, take[first] - first, pos[first] - first


def test_official_pose_bounds_skips_and_text():
    seq, target, available = 64, 512, 200
    firsts, content, position = set(), set(), set()
    for k in range(600):
        take, pos = official_pose(available, seq, target, example_generator(0, k))
        assert len(take) == len(pos) == seq and pos[0] == 0 and take[0] == 0
        assert all(b > a for a, b in zip(pos, pos[1:], strict=False)) and max(pos) < target
        first, skip, u = _chunks(take, pos)
        # The first chunk is at most half the row, its positions and text both start at 0.
        assert 1 <= first <= (seq + 1) // 2 and pos[:first] == list(range(first)) == take[:first]
        # The second chunk is contiguous text starting `skip` tokens after the first ends, within the text read.
        assert take[first:] == list(range(first + skip, seq + skip)) and take[-1] < available
        assert pos[first:] == list(range(first + u, seq + u))
        firsts.add(first)
        content.add(skip)
        position.add(u)
    # Both skips reach both ends of their ranges, and the content skip is not the position skip.
    assert {1, seq // 2} <= firsts and {0, available - seq} <= content and max(position) > available


def test_official_pose_row_reads_its_document_and_no_further():
    text = list(range(1000, 1000 + 400))
    ids, pos = official_pose_row(text, 64, 512, example_generator(1, 0))
    take, _ = official_pose(min(len(text), 5 * 64), 64, 512, example_generator(1, 0))
    assert ids == [text[i] for i in take] and len(ids) == 64
    # A document with no text after the row: no content skip, the row is the document itself.
    for k in range(50):
        ids, pos = official_pose_row(text[:64], 64, 512, example_generator(1, k))
        assert ids == text[:64] and pos[0] == 0 and max(pos) < 512
    # A document far longer than the row: the skip stays within 5 × seq_len tokens of the row's start.
    reached = max(max(official_pose_row(list(range(10_000)), 64, 512, example_generator(2, k))[0]) for k in range(300))
    assert 4 * 64 < reached < 5 * 64


def test_official_pose_is_a_function_of_seed_and_row():
    a = official_pose(300, 64, 512, keyed_generator(7, "pose", 0, 3))
    assert a == official_pose(300, 64, 512, keyed_generator(7, "pose", 0, 3))
    assert a != official_pose(300, 64, 512, keyed_generator(7, "pose", 0, 4))
    assert a != official_pose(300, 64, 512, keyed_generator(8, "pose", 0, 3))


def _corpus(tmp_path, n_docs=12):
    """Real text (standard-library sources) of mixed lengths, one document per line."""
    import json
    import sysconfig
    from pathlib import Path

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:n_docs]
    path = tmp_path / "docs.jsonl"
    sizes = [300, 3000, 800, 5000]
    path.write_text("".join(json.dumps({"text": f.read_text()[: sizes[i % 4]]}) + "\n" for i, f in enumerate(files)))
    return path


@pytest.mark.slow
def test_official_rows_come_from_the_packed_stream_within_one_document(tmp_path, tiny_tokenizer):
    from ctxext.recipe.sections import DataSection
    from ctxext.training.data.corpus import PoseRows, prepare_data, select_documents, tokenize_documents

    seq, target = 32, 256
    data = DataSection(path=str(_corpus(tmp_path)), validation_fraction=0.0, num_proc=1)
    rows = prepare_data(data, tiny_tokenizer, seq, pose=PoseRows(target, seed=3)).train.with_format(None)
    again = prepare_data(data, tiny_tokenizer, seq, pose=PoseRows(target, seed=3)).train.with_format(None)
    assert rows["input_ids"] == again["input_ids"] and rows["positions"] == again["positions"]
    docs = tokenize_documents(select_documents(data), tiny_tokenizer, 1)["input_ids"]
    stream = [t for d in docs for t in d]
    doc_end = [end for d, n in enumerate(len(x) for x in docs) for end in [sum(len(x) for x in docs[: d + 1])] * n]
    skipped = 0
    for i, (ids, pos) in enumerate(zip(rows["input_ids"], rows["positions"], strict=True)):
        start = i * seq
        end = doc_end[start + seq - 1]  # the end of the document the block ends in
        assert pos[0] == 0 and max(pos) < target and all(b > a for a, b in zip(pos, pos[1:], strict=False))
        # Some first chunk (at most half the row) and content skip explain the row exactly.
        found = [
            (first, v)
            for first in range(1, (seq + 1) // 2 + 1)
            for v in range(end - start - seq + 1)
            if ids == stream[start : start + first] + stream[start + first + v : start + seq + v]
        ]
        assert found, f"row {i} is not the official cut of its block"
        jump = next((j for j in range(1, seq) if pos[j] != pos[j - 1] + 1), None)
        assert jump is None or any(first == jump for first, _ in found)
        skipped += all(v > 0 for _, v in found)
    assert skipped > 0  # the content skip happens (text read beyond the block)


def test_pose_sampling_key():
    assert parse_recipe(_with()).train.pose.sampling == "official"
    with pytest.raises(RecipeError) as err:
        parse_recipe(_with(train__pose={"chunks": 3}))
    assert err.value.problems[0][0] == "train.pose.chunks" and "contiguous" in err.value.problems[0][1]
    assert parse_recipe(_with(train__pose={"chunks": 3, "sampling": "contiguous"})).train.pose.chunks == 3


@pytest.mark.parametrize("sampling", ["official", "contiguous"])
def test_document_masked_rows_get_pose_per_document(sampling):
    # Each document of a packed row gets its own skips; official: the first chunk at most half the document.
    seg = torch.tensor([[0] * 40 + [1] * 24])
    half = {0: 20, 1: 12}
    for example in range(40):
        inputs = build_inputs(
            {"input_ids": torch.zeros(1, 64, dtype=torch.long), "segments": seg},
            attn_implementation="sdpa",
            target_length=256,
            pose_chunks=2,
            pose_sampling=sampling,
            first_example=example,
        )
        for s, where in ((0, slice(0, 40)), (1, slice(40, 64))):
            pos = inputs.position_ids[0, where]
            steps = pos[1:] - pos[:-1]
            assert pos[0] == 0 and bool((steps >= 1).all()) and int(pos.max()) < 256 and int((steps > 1).sum()) <= 1
            jump = int(torch.nonzero(steps > 1).flatten()[0]) + 1 if bool((steps > 1).any()) else None
            if sampling == "official" and jump is not None:
                assert jump <= half[s]


def test_official_pose_run_trains_on_rows_with_their_own_positions(tmp_path, cache_root):
    import math

    from ctxext.recipe.schema import load_recipe
    from ctxext.training.run import read_run, train
    from tests.helpers.train import write_recipe

    recipe = load_recipe(
        write_recipe(
            tmp_path / "r.yaml",
            tmp_path / "run",
            train={"seq_len": 128, "max_steps": 2, "pose": {"chunks": 2}, "eval_every": 2, "eval_batches": 1},
        )
    )
    assert recipe.train.pose.sampling == "official"
    run = read_run(train(recipe).run_dir)
    assert run.status == "complete" and math.isfinite(run.final_train_loss)
