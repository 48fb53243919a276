"""Sequence parallelism (``train.sequence_parallel_size``, DeepSpeed Ulysses) on the CPU over gloo.

The 2-process tests launch the way users launch (``accelerate launch --multi_gpu --num_processes 2`` with
``ACCELERATE_USE_CPU=true``) and compare with one process: the loss within 1e-6 and every trainable gradient within
1e-5 (relative) on 2,048-token rows, and the adapter after six optimizer steps of ``ctxext train``, killed and
resumed on the way.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.errors import InputError
from ctxext.planner.footprint import ModelShape, Setup, footprint
from ctxext.recipe.parallel import UlyssesPlan, check_split_launch, ulysses_plan
from ctxext.recipe.schema import RecipeError, load_recipe
from ctxext.training.data.rows import IGNORE_INDEX, ModelInputs, build_inputs
from ctxext.training.sequence_parallel import SequenceSplit, check_heads
from tests.helpers.tiny import tiny_model
from tests.helpers.train import (
    ROOT,
    accelerate_cmd,
    adapter_tensors,
    ctxext_cmd,
    env,
    head_shape_model,
    run,
    write_recipe,
)

deepspeed_missing = pytest.mark.skipif(
    __import__("importlib").util.find_spec("deepspeed") is None,
    reason="needs deepspeed (pip install 'ctxext[deepspeed]')",
)
# The tiny Llama (4 heads, 2 key/value heads) at 2,048 tokens, 8x its window, with YaRN.
SPLIT = {
    "rope": {"method": "yarn", "target_length": 4096},
    "train": {"seq_len": 2048, "micro_batch_size": 2, "loss_chunk_size": 512},
}


def _kill_tree(pid: int) -> None:
    """SIGKILL a launcher and every process under it (torch's launcher starts its workers in sessions of their own)."""
    import psutil  # a DeepSpeed dependency

    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in procs:
        p.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=30)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / a.norm())


# ---- the shard: padding, positions, refusals (no processes needed) ----


def test_shards_pad_to_a_multiple_and_keep_global_positions():
    ids = torch.arange(14).reshape(2, 7) + 100
    inputs = build_inputs({"input_ids": ids}, attn_implementation="sdpa", target_length=64, pose_chunks=2, seed=3)
    shards = [SequenceSplit(size=3, rank=r).shard(inputs) for r in range(3)]
    assert all(s.input_ids.shape == (2, 3) for s in shards)  # 7 tokens padded to 9, 3 per process
    joined = ModelInputs(
        *(torch.cat([getattr(s, k) for s in shards], dim=1) for k in ("input_ids", "labels", "position_ids"))
    )
    assert torch.equal(joined.input_ids[:, :7], ids) and torch.equal(joined.labels[:, :7], inputs.labels)
    assert (joined.labels[:, 7:] == IGNORE_INDEX).all()  # padding is never scored
    # PoSE positions pass unchanged; padding continues them, so the gathered row stays one causal sequence.
    assert torch.equal(joined.position_ids[:, :7], inputs.position_ids)
    assert torch.equal(joined.position_ids[:, 7:], inputs.position_ids[:, -1:] + torch.tensor([1, 2]))
    assert all(s.attention_mask.shape == (2, 3) and s.attention_mask.all() for s in shards)


def test_plain_rows_get_their_positions_and_no_split_changes_nothing():
    ids = torch.arange(8).reshape(1, 8)
    inputs = build_inputs({"input_ids": ids}, attn_implementation="sdpa")
    assert inputs.position_ids is None
    assert SequenceSplit().shard(inputs) is inputs
    assert torch.equal(SequenceSplit(size=2, rank=1).shard(inputs).position_ids, torch.arange(4, 8).reshape(1, 4))


def test_a_short_validation_batch_is_filled_with_row_0():
    from datasets import Dataset

    from ctxext.training.sequence_parallel import split_rows

    data = Dataset.from_dict({"input_ids": [[1, 2], [3, 4], [5, 6]]}).with_format("torch")
    rows, real = split_rows(data, first=2, n=3, micro_batch_size=2)
    assert real == 1 and rows["input_ids"].tolist() == [[5, 6], [1, 2]]
    rows, real = split_rows(data, first=4, n=3, micro_batch_size=2)  # nothing left for this process
    assert real == 0 and rows["input_ids"].tolist() == [[1, 2], [1, 2]]


def test_rows_of_several_documents_drop_the_mask_and_restart_positions_at_each_document():
    rows = {"input_ids": torch.arange(8).reshape(1, 8), "segments": torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])}
    inputs = build_inputs(rows, attn_implementation="sdpa")
    assert inputs.attention_mask.dim() == 4
    shards = [SequenceSplit(size=2, rank=r).shard(inputs) for r in range(2)]
    # No 4D mask reaches DeepSpeed (it would drop it); the positions carry the documents.
    assert all(s.attention_mask.shape == (1, 4) for s in shards)
    assert torch.cat([s.position_ids for s in shards], dim=1).tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]


def test_segment_attention_equals_the_block_causal_mask():
    # What the split runs after the all-to-all: the gathered sequence, positions restarting at each document
    # (the third row PoSE-like, with a skip that is not a restart).
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from ctxext.training.data.rows import block_causal_mask
    from ctxext.training.sequence_parallel import segment_attention

    gen = torch.Generator().manual_seed(0)
    segments = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4, [0] * 16, [0] * 9 + [1] * 7])
    positions = torch.tensor([[*range(5), *range(7), *range(4)], [*range(16)], [*range(4), *range(40, 45), *range(7)]])
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    q = torch.randn(3, 4, 16, 8, generator=gen)
    k, v = (torch.randn(3, 2, 16, 8, generator=gen) for _ in range(2))
    want, _ = sdpa_attention_forward(module, q, k, v, block_causal_mask(segments), scaling=0.3)
    got, _ = segment_attention(sdpa_attention_forward)(module, q, k, v, None, scaling=0.3, position_ids=positions)
    assert got.shape == want.shape == (3, 16, 4, 8)
    assert torch.allclose(got, want, atol=1e-6)
    # Without a restart it is the plain causal call.
    causal, _ = sdpa_attention_forward(module, q[1:2], k[1:2], v[1:2], None)
    assert torch.equal(segment_attention(sdpa_attention_forward)(module, q[1:2], k[1:2], v[1:2], None)[0], causal)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("rope.method=dynamic", "rope.method 'dynamic'"),
        ("rope.method=longrope", "rope.method 'longrope'"),
        ("model.attn_implementation=eager", "eager"),
    ],
)
def test_recipes_the_split_cannot_serve_are_refused(tmp_path, override, says):
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **SPLIT)
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe, ["train.sequence_parallel_size=2", override])
    [(key, message)] = err.value.problems
    assert key == "train.sequence_parallel_size" and says in message


def test_rows_of_several_documents_are_accepted(tmp_path):
    mixture = [{"path": "builtin:stdlib", "weight": 1}, {"task": "passkey", "weight": 1}]
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", data={"path": None, "mixture": mixture}, **SPLIT)
    loaded = load_recipe(recipe, ["train.sequence_parallel_size=2", "data.document_mask=true"])
    assert loaded.train.sequence_parallel_size == 2 and loaded.data.document_mask


def test_a_ring_follows_the_same_recipe_rules_and_composes_with_the_head_split(tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **SPLIT)
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe, ["train.context_parallel_size=2", "rope.method=dynamic"])
    [(key, message)] = err.value.problems
    assert key == "train.context_parallel_size" and "rope.method 'dynamic'" in message
    both = load_recipe(recipe, ["train.context_parallel_size=2", "train.sequence_parallel_size=2"]).train
    assert (both.context_parallel_size, both.sequence_parallel_size) == (2, 2)


def test_the_head_plan_shares_query_heads_evenly_and_replicates_what_two_ranks_read():
    smollm2 = ulysses_plan(9, 3, 2)
    assert isinstance(smollm2, UlyssesPlan) and smollm2.engine == "ctxext"  # DeepSpeed needs 9 % 2 == 0
    assert smollm2.query == ((0, 4), (4, 9)) and smollm2.kv == ((0, 2), (1, 3)) and smollm2.replicated_kv == 1
    four = ulysses_plan(9, 3, 4)
    assert four.query == ((0, 2), (2, 4), (4, 6), (6, 9)) and four.kv == ((0, 1), (0, 2), (1, 2), (2, 3))
    # DeepSpeed's shapes: N divides the query heads and divides, or is a multiple of, the key/value heads.
    for heads, kv, size in [(4, 2, 2), (4, 2, 4), (4, 1, 2), (4, 1, 4), (32, 8, 8), (32, 8, 16)]:
        assert ulysses_plan(heads, kv, size).engine == "deepspeed", (heads, kv, size)
    for heads, kv, size in [(4, 2, 3), (3, 1, 2), (28, 4, 8), (32, 8, 12)]:
        assert ulysses_plan(heads, kv, size).engine == "ctxext", (heads, kv, size)
    assert ulysses_plan(4, 2, 1).engine == "none"
    # Wider than the query heads: refused, naming the hybrid with a ring.
    too_wide = ulysses_plan(32, 8, 64)
    assert isinstance(too_wide, str) and "32 attention heads" in too_wide
    assert "train.sequence_parallel_size=32 train.context_parallel_size=2" in too_wide


def test_local_kv_groups_keep_grouped_attention_where_a_rank_s_heads_group_evenly():
    from ctxext.training.ulysses import local_kv_groups

    plan = ulysses_plan(9, 3, 4)  # query heads 0-1, 2-3, 4-5, 6-8 over key/value heads 0, 0-1, 1, 2
    assert [local_kv_groups(plan, r)[0] for r in range(4)] == [2, 1, 2, 3]
    groups, index = local_kv_groups(ulysses_plan(9, 3, 2), 1)  # heads 4-8: key/value 1 twice, 2 three times
    assert groups == 1 and index.tolist() == [0, 0, 1, 1, 1]


def test_the_ring_is_refused_where_torch_s_ring_cannot_run_it():
    from transformers import LlamaConfig, MistralConfig

    from ctxext.recipe.parallel import ring_refusal

    llama = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    assert ring_refusal(llama, "sdpa", cuda=True) is None and ring_refusal(None, "sdpa", cuda=True) is None
    assert "only CUDA SDPA kernels" in ring_refusal(llama, "sdpa", cuda=False)
    assert "model.attn_implementation: sdpa" in ring_refusal(llama, "flash_attention_2", cuda=True)
    windowed = MistralConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, sliding_window=128)
    assert "within a window" in ring_refusal(windowed, "sdpa", cuda=True)


def test_stopping_the_split_gives_back_the_attention_it_replaced():
    # After training, what runs in the main process (the recipe's evaluation) must attend on its own.
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from ctxext.training import sequence_parallel as sp

    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    model = tiny_model(num_attention_heads=4, num_key_value_heads=1)
    attention = model.model.layers[0].self_attn
    sp._CORES.setdefault("sdpa", original)
    ALL_ATTENTION_FUNCTIONS["sdpa"] = sp.segment_attention(original)  # a split's wrapper
    attention.num_key_value_groups = 2  # as DeepSpeed leaves it when it replicates the key/value head over 2
    try:
        sp.stop_sequence_parallel(model)
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is original and attention.num_key_value_groups == 4
    finally:
        ALL_ATTENTION_FUNCTIONS["sdpa"] = original


def test_heads_and_launch_size_are_checked(cache_root):
    from transformers import AutoConfig

    from ctxext.models.sources import resolve_model_path

    config = AutoConfig.from_pretrained(resolve_model_path("builtin:tiny-llama"))  # 4 heads, 2 key/value heads
    assert check_heads(config, 2).engine == check_heads(config, 4).engine == "deepspeed"
    assert check_heads(config, 3).engine == "ctxext"
    with pytest.raises(InputError, match=r"train.sequence_parallel_size: 5 exceeds the model's 4 attention heads"):
        check_heads(config, 5)
    with pytest.raises(InputError, match=r"2 does not divide the 3 process\(es\)"):
        check_split_launch(2, 3)
    with pytest.raises(InputError, match=r"train.context_parallel_size = 4 does not divide the 6 process\(es\)"):
        check_split_launch(2, 6, context_parallel=2)
    check_split_launch(2, 4)
    check_split_launch(2, 8, context_parallel=2)


@pytest.mark.slow
def test_cli_refuses_a_split_it_cannot_make_and_writes_nothing(tmp_path, cache_root):
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **SPLIT)
    # One process cannot hold a split of 2.
    done = run(ctxext_cmd("train", str(recipe), "train.sequence_parallel_size=2"), CTXEXT_CACHE=str(cache_root))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "train.sequence_parallel_size: 2 does not divide the 1 process(es)" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()
    # Without DeepSpeed (None in sys.modules: Python's own "not importable"), the message names the extra.
    argv = ["ctxext", "train", str(recipe), "train.sequence_parallel_size=2"]
    code = f"import runpy, sys; sys.modules['deepspeed'] = None; sys.argv = {argv!r}; runpy.run_module('ctxext')"
    done = run([sys.executable, "-c", code], CTXEXT_CACHE=str(cache_root))
    assert done.returncode == 2, done.stderr[-2000:]
    says = "train.sequence_parallel_size: 2 splits this model's 4 heads with DeepSpeed's Ulysses attention"
    assert says in done.stderr and "ctxext[deepspeed]" in done.stderr
    assert not (tmp_path / "run").exists()


# ---- the plan (config only) ----


def test_plan_divides_activations_by_the_split_but_not_the_all_to_all_buffers():
    # The tiny Llama by hand: hidden 64, 2 layers, 4 heads of 16, 2 key/value heads.
    shape = ModelShape(vocab=512, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, tied=False)
    setup = Setup(seq_len=8192, optimizer="adamw", loss_chunk=256)
    one, two = footprint(shape, setup), footprint(shape, dataclasses.replace(setup, sequence_parallel=2, world=2))
    size_one, size_two = ({c.name: c.bytes for c in fp.components} for fp in (one, two))
    per_token = ["layer inputs (checkpoints)", "backward working set", "final norm + hidden states"]
    for name in [*per_token, "grad of hidden states"]:
        assert abs(size_two[name] - size_one[name] / 2) <= 1, name
    # The recomputed layer halves too, but for o_proj's input: the attention output swapped back is a new tensor
    # (without the split it is the kernel's own), 4096 tokens × q 64 × fp32.
    assert size_two["recomputed layer"] == size_one["recomputed layer"] / 2 + 4096 * 64 * 4
    # Not divided by the split: one layer's exchange in flight (send + receive copies of q, k, v), fp32 stream.
    q_k_v = 64 + 2 * 32
    assert size_two["Ulysses all-to-all buffers in flight"] == 2 * 4096 * q_k_v * 4
    assert "Ulysses all-to-all buffers in flight" not in size_one and one.all_to_all == 0
    # Sent per micro-batch: 2 layers x 3 passes (forward, recomputation, backward) x the half that leaves.
    q_k_v_out = 2 * 64 + 2 * 32
    assert two.all_to_all == 2 * 3 * (4096 * q_k_v_out // 2) * 4


def test_plan_offers_the_split_and_re_plans_it():
    runner = CliRunner()
    # 384k tokens: beyond one H100 even with the train.memory levers (on by default on a GPU).
    length = ["train.seq_len=393216", "rope.target_length=393216"]
    args = ["plan", "recipes/llama3-8b-yarn-64k.yaml", *length, "--gpu", "h100-80gb", "--json"]
    alone = json.loads(runner.invoke(app, args).output)
    assert not alone["fits"]
    [offer] = [a for a in alone["advice"] if "train.sequence_parallel_size=2" in a["overrides"]]
    assert offer["fits"] and "--num_processes 2" in offer["launch"] and "ctxext[deepspeed]" in offer["launch"]
    split = json.loads(runner.invoke(app, [*args, "--sp", "2"]).output)  # --sp 2 alone plans 2 GPUs
    assert split["fits"] and split["setup"]["sequence_parallel"] == 2 and split["setup"]["world"] == 2
    assert split["total_gib"] == pytest.approx(offer["total_gib"])
    assert split["longest_seq_len"] > alone["longest_seq_len"] and split["all_to_all_gib_per_step"] > 0
    # More processes than query heads: refused with training's own message (ulysses_plan).
    bad = runner.invoke(app, [*args, "--sp", "64"], env={"COLUMNS": "300"})
    assert bad.exit_code == 2 and "train.sequence_parallel_size: 64 exceeds" in " ".join(bad.output.split())


# ---- two real processes over gloo ----


# name → (query heads, key/value heads, head dim): one key/value head (DeepSpeed replicates it), SmolLM2-135M's
# shape at a tiny hidden size, and 3 heads / 1 key/value head (neither divides 2: ctxext's own attention).
SHAPES = {"kv1": (4, 1, 16), "smollm2": (9, 3, 8), "three": (3, 1, 16)}


@pytest.mark.slow
@deepspeed_missing
def test_split_over_2_and_4_processes_gives_the_one_process_loss_and_gradients(tmp_path, cache_root):
    # One launch per process count, several head shapes each: the built-in tiny Llama (4 heads, 2 key/value heads)
    # at 2,048 tokens, the shapes above at 512. Four processes: 4 over one sequence (DeepSpeed, key/value head
    # replicated 4x; ctxext's, 3/2/2/2 query heads) and two groups of two (ctxext's, data parallel 2).
    recipes = {"tiny": write_recipe(tmp_path / "tiny.yaml", tmp_path / "run", **SPLIT)}
    short = {**SPLIT, "train": {**SPLIT["train"], "seq_len": 512}}
    for name, shape in SHAPES.items():
        model = {"path": str(head_shape_model(tmp_path / name, *shape))}
        recipes[name] = write_recipe(tmp_path / f"{name}.yaml", tmp_path / "run", model=model, **short)
    cases = "plain,pose,masked,ignored"
    worker = str(ROOT / "tests" / "helpers" / "sp_worker.py")
    one = run([sys.executable, worker, str(tmp_path / "one.pt"), cases, *map(str, recipes.values())], timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    ref = torch.load(tmp_path / "one.pt")["recipes"]
    launches = {
        2: {"tiny": 2, "kv1": 2, "smollm2": 2, "three": 2},
        4: {"kv1": 4, "smollm2": 4, "three": 2},
    }
    engines = {("tiny", 2): "deepspeed", ("kv1", 2): "deepspeed", ("kv1", 4): "deepspeed"}
    for processes, sizes in launches.items():
        cmd = accelerate_cmd(processes, str(tmp_path / f"{processes}.pt"), cases)
        cmd[cmd.index("-m") : cmd.index("ctxext") + 1] = [worker]  # a script, not `-m ctxext`
        cmd += [f"{recipes[name]}:{size}" for name, size in sizes.items()]
        done = run(cmd, timeout=600, ACCELERATE_USE_CPU="true", CTXEXT_CACHE=str(cache_root))
        assert done.returncode == 0, done.stderr[-3000:]
        got = torch.load(tmp_path / f"{processes}.pt")
        assert got["processes"] == processes
        for name, size in sizes.items():
            split = got["recipes"][f"{name}.yaml:{size}"]
            assert split["engine"] == engines.get((name, size), "ctxext"), (name, size)
            for case in cases.split(","):
                want, have = ref[f"{name}.yaml"][case], split[case]
                where = (processes, name, case)
                assert torch.isfinite(torch.tensor(have["loss"]))
                assert abs(have["loss"] - want["loss"]) <= 1e-6 * abs(want["loss"]), where
                assert want["grads"].keys() == have["grads"].keys()
                for param, grad in want["grads"].items():
                    assert grad.norm() > 0, param  # every gradient is exercised (LoRA B starts non-zero)
                    assert _relative(grad, have["grads"][param]) <= 1e-5, (*where, param)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (one process per GPU)")
def test_ring_and_hybrid_splits_on_gpus_give_the_one_process_loss_and_gradients(tmp_path, cache_root):
    # fp32 weights and activations, SDPA: one process against torch's ring over 2 GPUs (context parallelism), ctxext's
    # own Ulysses attention over NCCL, and with 4 GPUs the hybrid (2 ring shards x 2 Ulysses ranks; DeepSpeed's and
    # ctxext's attention). Rows without PoSE or documents: the ring refuses them.
    exact = {"quantization": {"mode": "none", "compute_dtype": "float32"}, "model": {"attn_implementation": "sdpa"}}
    tiny = write_recipe(tmp_path / "tiny.yaml", tmp_path / "run", **SPLIT, **exact)
    short = {**SPLIT, "train": {**SPLIT["train"], "seq_len": 512}}
    smollm2 = {"path": str(head_shape_model(tmp_path / "smollm2", *SHAPES["smollm2"])), "attn_implementation": "sdpa"}
    shaped = write_recipe(tmp_path / "smollm2.yaml", tmp_path / "run", **{**short, **exact, "model": smollm2})
    cases = "plain,ignored"
    worker = str(ROOT / "tests" / "helpers" / "sp_worker.py")
    one = run([sys.executable, worker, str(tmp_path / "one.pt"), cases, str(tiny), str(shaped)], timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    ref = torch.load(tmp_path / "one.pt")["recipes"]
    processes = 4 if torch.cuda.device_count() >= 4 else 2
    specs = {"tiny": f"{tiny}:1:2", "smollm2": f"{shaped}:2"}
    if processes == 4:
        specs.update(tiny_hybrid=f"{tiny}:2:2", smollm2_hybrid=f"{shaped}:2:2")
    # the first spec sets the launch check: 2 processes per sequence divide 2 and 4
    cmd = accelerate_cmd(processes, str(tmp_path / "split.pt"), cases)
    cmd[cmd.index("-m") : cmd.index("ctxext") + 1] = [worker]
    done = run(cmd + list(specs.values()), timeout=600, CTXEXT_CACHE=str(cache_root))
    assert done.returncode == 0, done.stderr[-3000:]
    got = torch.load(tmp_path / "split.pt")["recipes"]
    for name, spec in specs.items():
        for case in cases.split(","):
            want, have = ref[f"{name.removesuffix('_hybrid')}.yaml"][case], got[Path(spec).name][case]
            assert abs(have["loss"] - want["loss"]) <= 1e-5 * abs(want["loss"]), (name, case)
            for param, grad in want["grads"].items():
                assert _relative(grad, have["grads"][param]) <= 1e-4, (name, case, param)


@pytest.mark.slow
@deepspeed_missing
def test_two_process_ctxext_train_killed_and_resumed_ends_with_the_one_process_adapter(tmp_path, cache_root):
    # One process, straight through; two processes splitting every row, SIGKILLed after step 3 (checkpoint at
    # step 2) and resumed with --resume: the same per-step losses, validation loss and adapter.
    from ctxext.training.run import read_run, train

    sections = {
        **SPLIT,
        "data": {"max_documents": 40, "validation_fraction": 0.1},
        "train": {**SPLIT["train"], "max_steps": 6, "save_every": 2, "eval_batches": 1},
    }
    train(load_recipe(write_recipe(tmp_path / "a.yaml", tmp_path / "one", **sections)))
    recipe = write_recipe(tmp_path / "b.yaml", tmp_path / "two", **sections)
    cmd = accelerate_cmd(2, "train", str(recipe), "train.sequence_parallel_size=2")
    launch_env = env(ACCELERATE_USE_CPU="true", CTXEXT_CACHE=str(cache_root))
    metrics = tmp_path / "two" / "metrics.jsonl"
    proc = subprocess.Popen(cmd, cwd=ROOT, env=launch_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if metrics.exists() and any(json.loads(x)["step"] >= 3 for x in metrics.read_text().splitlines() if x):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed"
        _kill_tree(proc.pid)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            _kill_tree(proc.pid)
    assert read_run(tmp_path / "two", allow_incomplete=True).status == "running"
    done = run([*cmd, "--resume"], ACCELERATE_USE_CPU="true", CTXEXT_CACHE=str(cache_root))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from" in done.stdout + done.stderr

    one, two = read_run(tmp_path / "one"), read_run(tmp_path / "two")
    assert two.num_processes == 2 and two.tokens_seen == one.tokens_seen == 6 * 2 * 2048
    losses = [
        [json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines()]
        for d in (tmp_path / "one", tmp_path / "two")
    ]
    assert len(losses[1]) == 6
    for a, b in zip(*losses, strict=True):
        assert abs(a - b) <= 1e-5 * a
    assert abs(one.final_val_loss - two.final_val_loss) <= 1e-5 * one.final_val_loss
    a, b = adapter_tensors(tmp_path / "one"), adapter_tensors(tmp_path / "two")
    assert a.keys() == b.keys()
    for name in a:
        assert _relative(a[name], b[name]) <= 1e-4, name
