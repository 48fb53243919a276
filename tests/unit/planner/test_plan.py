"""`ctxext plan`: component arithmetic, verdicts, the longest-length search, advice, CLI and bad input.

Config-only throughout: no weights are loaded, nothing is trained.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.errors import InputError
from ctxext.models.devices import GIB, Device, gpu, parse_memory
from ctxext.planner.fit import HEADROOM, longest_fit
from ctxext.planner.footprint import ModelShape, Setup, footprint
from ctxext.planner.plan import plan_recipe, read_model_config
from ctxext.recipe.schema import load_recipe

runner = CliRunner()
LLAMA2 = "recipes/llama2-7b-yarn-32k.yaml"
LLAMA3 = "recipes/llama3-8b-yarn-64k.yaml"

# A tiny Llama, by hand: vocab 512, hidden 64, intermediate 128, 2 layers, 4 heads of 16, 2 KV heads.
TINY = ModelShape(vocab=512, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, tied=False)
SETUP = Setup(
    seq_len=1024,
    quantization="nf4",
    double_quant=True,
    compute_bytes=2,
    lora_r=8,
    extra_trainable=("embed_tokens", "norm"),
    optimizer="adamw",
    checkpointing=True,
    loss="chunked",
    loss_chunk=256,
)


def _component(fp, name: str) -> int:
    return next(c.bytes for c in fp.components if c.name == name)


def test_components_match_hand_arithmetic():
    fp = footprint(TINY, SETUP)
    # Projections per layer: q 64·64 + k 64·32 + v 64·32 + o 64·64 + gate/up/down 3·64·128 = 36,864; 2 layers.
    linear = 2 * 36864
    # nf4 with double quantization: 4 bits + an 8-bit absmax per 64 values + an fp32 constant per 256 blocks.
    assert _component(fp, "decoder projections") == int(linear * (0.5 + 1 / 64 + 4 / (64 * 256)))
    # peft upcasts the non-quantized weights of a k-bit model to fp32.
    assert _component(fp, "embed_tokens") == 512 * 64 * 4
    assert _component(fp, "lm_head") == 512 * 64 * 4
    assert _component(fp, "norms") == 5 * 64 * 4
    # LoRA r=8: r·(in+out) per projection: q 8·128, k 8·96, v 8·96, o 8·128, gate/up/down 8·192 → 8,192 per layer.
    assert _component(fp, "LoRA params") == 2 * 8192 * 4
    # modules_to_save: embed_tokens (512·64) and every *norm (2 per layer + the final one), fp32 copies.
    extra = 512 * 64 + 5 * 64
    assert _component(fp, "modules_to_save params") == extra * 4
    assert _component(fp, "gradients") == (2 * 8192 + extra) * 4
    assert _component(fp, "optimizer (adamw)") == 2 * (2 * 8192 + extra) * 4
    # Checkpointing keeps each layer's fp32 input; one layer is recomputed, its saved tensors as measured
    # (tests/unit/planner/test_plan_layer.py), per token: the norms' normalised values (trained) 2h, their reciprocal
    # RMS (4 B each), the post-attention norm's input h, the two norm outputs LoRA reads 2h, rotated q and k, v and the
    # attention output 2q + 2kv, the log-sum-exp (4 heads × 4 B), the MLP's 4i, and lora_A's rank-8 outputs.
    assert _component(fp, "layer inputs (checkpoints)") == 2 * 1024 * 64 * 4
    values = 2 * 64 + 64 + 2 * 64 + 2 * 64 + 2 * 32 + 4 * 128 + 7 * 8
    assert _component(fp, "recomputed layer") == 1024 * (values * 4 + 2 * 4 + 4 * 4)
    # Chunked loss: the grad of the hidden states, and one chunk of fp32 logits (+ its hidden-size product).
    assert _component(fp, "grad of hidden states") == 1024 * 64 * 4
    assert _component(fp, "one chunk of logits (256 tokens)") == 256 * 512 * 4 + 256 * 64 * 4
    # The peak is the largest phase, not the sum of everything.
    assert fp.total == max(fp.phase_total(p) for p in ("loss", "backward", "step"))
    assert fp.total < sum(c.bytes for c in fp.components)


def test_setup_changes_move_the_right_terms():
    base = footprint(TINY, SETUP)
    no_ckpt = footprint(TINY, dataclasses.replace(SETUP, checkpointing=False))
    # Without checkpointing each layer also keeps its (fp32) input, which its input norm saves.
    layer_and_input = _component(base, "recomputed layer") + 1024 * 64 * 4
    assert _component(no_ckpt, "all layers' saved tensors") == 2 * layer_and_input
    full = footprint(TINY, dataclasses.replace(SETUP, loss="full"))
    assert _component(full, "full logits: log-softmax + 2 grads") == 1024 * 512 * 4 * 3
    eight_bit = footprint(TINY, dataclasses.replace(SETUP, optimizer="paged_adamw_8bit"))
    assert _component(eight_bit, "optimizer (paged_adamw_8bit)") < _component(base, "optimizer (adamw)")
    bf16_base = footprint(TINY, dataclasses.replace(SETUP, quantization="none"))
    assert _component(bf16_base, "decoder projections") == 2 * 36864 * 2
    eager = footprint(TINY, dataclasses.replace(SETUP, attention="eager", seq_len=4096))
    sdpa = footprint(TINY, dataclasses.replace(SETUP, seq_len=4096))
    assert _component(eager, "recomputed layer") > 4 * _component(sdpa, "recomputed layer")  # T² vs T
    cp = footprint(TINY, dataclasses.replace(SETUP, seq_len=4096, context_parallel=4, world=4, sharding="fsdp2"))
    assert _component(cp, "layer inputs (checkpoints)") == _component(base, "layer inputs (checkpoints)")


def test_gpu_table_and_memory_parsing():
    assert gpu("H100-80GB").memory == 81559 * 2**20
    assert gpu("a100_80gb").tflops == 312
    assert parse_memory("80GB") == 80 * 10**9
    assert parse_memory("80GiB") == 80 * GIB
    assert parse_memory("24g") == 24 * GIB
    assert parse_memory("40960MiB") == 40 * GIB
    with pytest.raises(InputError, match="h100-80gb"):
        gpu("h1000")
    for bad in ("abc", "", "80 parsecs", "-3GB", "0GB"):
        with pytest.raises(InputError, match="cannot read"):
            parse_memory(bad)


# The memory levers of train.memory off (on a GPU they are on by default): the recipe as peft + transformers run it.
LEVERS_OFF = [
    "train.memory.offload_checkpoints=false",
    "train.memory.tiled_mlp=false",
    "train.memory.residual_dtype=fp32",
    "train.memory.expandable_segments=false",
]


def _plan(path=LLAMA2, overrides=(), device="h100-80gb", **kw):
    return plan_recipe(load_recipe(path, list(overrides)), gpu(device) if isinstance(device, str) else device, **kw)


def test_verdict_and_longest_length_on_the_shipped_recipe():
    plan = _plan()
    assert plan.fits and plan.band.high <= plan.device.memory * (1 - HEADROOM)
    assert plan.longest >= plan.setup.seq_len
    at = dataclasses.replace(plan.setup, seq_len=plan.longest)
    beyond = dataclasses.replace(plan.setup, seq_len=plan.longest + 1024)
    from ctxext.planner.fit import device_footprint, upper

    # The longest length is the longest whose band's upper end fits: the plan itself then has the band's slack.
    usable = plan.device.memory * (1 - HEADROOM)
    assert upper(device_footprint(plan.shape, at, plan.device).total, plan.device) <= usable
    assert upper(device_footprint(plan.shape, beyond, plan.device).total, plan.device) > usable
    assert device_footprint(plan.shape, beyond, plan.device).total < usable
    # With the memory levers off, 32k tokens of Llama 2 7B do not fit a 24 GB L4.
    small = _plan(overrides=LEVERS_OFF, device="l4")
    assert not small.fits and small.advice


def test_longest_length_is_monotone_in_memory():
    plan = _plan(search=False, advise_changes=False)
    longest = [
        longest_fit(plan.shape, plan.setup, Device(f"{g} GiB", g * GIB, None)) or 0
        for g in (8, 16, 24, 40, 80, 141, 192)
    ]
    assert longest == sorted(longest)
    assert longest[0] < longest[-1]


def test_512k_on_one_80gb_gpu_gets_advice_that_fits_when_replanned():
    overrides = ["rope.target_length=524288", "train.seq_len=524288"]
    plan = _plan(overrides=overrides)
    assert not plan.fits
    cp = [a for a in plan.advice if any(o.startswith("train.context_parallel_size=") for o in a.overrides)]
    assert cp and cp[0].fits
    # Re-plan the advice through the recipe path: its overrides on as many GPUs as it says.
    k = int(cp[0].overrides[-1].split("=")[1])
    again = _plan(overrides=overrides + cp[0].overrides, num_gpus=k)
    assert again.fits and again.setup.context_parallel == k and again.setup.sharding == "fsdp2"
    assert again.memory.total == cp[0].total


def test_advice_for_a_plain_setup_lists_the_usual_fixes():
    overrides = ["train.gradient_checkpointing=false", "train.micro_batch_size=2", "train.optimizer=adamw"]
    plan = _plan(overrides=[*overrides, "train.memory.fit_micro_batch=false"])  # the plain setup, as given
    summaries = " | ".join(a.summary for a in plan.advice)
    assert "gradient checkpointing" in summaries and "micro-batch" in summaries
    for advice in plan.advice:
        assert advice.total < plan.memory.total  # every listed change lowers the re-planned peak


def test_throughput_and_wall_time():
    plan = _plan()
    n = plan.shape.matmul_params()
    attn = 6 * 32 * 32768 * 4096
    tiled_recompute = 2 * 32 * 3 * 4096 * 11008  # one more MLP forward per layer (the tiled MLP, on by default)
    assert plan.flops_per_token == pytest.approx((6 * n + attn) * 4 / 3 + tiled_recompute)
    assert plan.tokens_per_second == pytest.approx(0.4 * 989e12 / plan.flops_per_token)
    assert plan.wall_seconds == pytest.approx(400 * 2 * 32768 / plan.tokens_per_second)


def test_bundled_config_is_labelled_and_read_without_the_network(monkeypatch):
    import ctxext.models.sources

    def no_hub(*args, **kwargs):
        raise AssertionError("the planner asked the Hub for a config it bundles")

    # An online-looking machine: the bundled copy must still win, without a Hub lookup (offline, the Hub
    # client would retry for ~23 s first).
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(ctxext.models.sources, "load_config", no_hub)
    config, source = read_model_config("meta-llama/Meta-Llama-3-8B")
    assert config.vocab_size == 128256 and config.num_key_value_heads == 8
    assert "bundled" in source


@pytest.mark.parametrize("recipe", [LLAMA2, LLAMA3])
def test_cli_prints_table_verdict_and_longest_length(recipe):
    result = runner.invoke(app, ["plan", recipe, "--gpu", "h100-80gb"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for text in ("decoder projections", "recomputed layer", "peak (", "longest seq_len that fits", "tokens/s"):
        assert text in result.output
    assert re.search(r"\b(fits|does not fit)\b", result.output)
    assert re.search(r"longest seq_len that fits with these settings: [\d,]+ tokens", result.output)


def test_cli_json():
    import json

    result = runner.invoke(app, ["plan", LLAMA2, "--gpu-memory", "24GiB", "--json", *LEVERS_OFF])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["fits"] is False and data["advice"] and data["device"]["memory_gib"] == 24


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "h1000"], "unknown GPU 'h1000'; known: a100-40gb"),
        (["--gpu-memory", "abc"], "cannot read 'abc' as a memory size"),
        ([], "pass exactly one of --gpu"),
        (["--gpu", "h100-80gb", "model.path=nobody/not-a-model"], "cannot read the config of 'nobody/not-a-model'"),
        (["--gpu", "h100-80gb", "train.context_parallel_size=3", "--num-gpus", "4"], "does not divide"),
    ],
)
def test_cli_bad_input_exits_2_with_a_clear_message(args, message):
    result = runner.invoke(app, ["plan", LLAMA2, *args], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_train_strict_refuses_a_run_the_plan_says_will_not_fit(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    args = [
        "train",
        "recipes/tiny-cpu.yaml",
        f"model.path={tiny_model_dir}",
        "rope.target_length=16777216",
        "train.seq_len=16777216",
        "train.gradient_checkpointing=false",
        f"output.dir={out}",
        "--strict",
    ]
    result = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert "--strict: not started" in " ".join(result.output.split())
    assert not out.exists()


def test_plan_on_this_machine_plans_a_cpu_run_against_ram(tiny_model_dir):
    from ctxext.planner.plan import plan_on_this_machine

    plan = plan_on_this_machine(load_recipe("recipes/tiny-cpu.yaml", [f"model.path={tiny_model_dir}"]))
    assert plan.device.kind == "cpu" and "RAM" in plan.device.name
    assert plan.setup.compute_bytes == 4 and plan.setup.optimizer == "adamw"
    assert plan.fits


def test_train_memory_check_warns_without_strict(tiny_model_dir, capsys):
    from ctxext.cli.train_commands import _check_memory

    big = [f"model.path={tiny_model_dir}", "rope.target_length=16777216", "train.seq_len=16777216"]
    _check_memory(load_recipe("recipes/tiny-cpu.yaml", big), strict=False)  # returns: the run would go on
    err = " ".join(capsys.readouterr().err.split())
    assert "warning:" in err and "will probably run out of memory" in err
    _check_memory(load_recipe("recipes/tiny-cpu.yaml", [f"model.path={tiny_model_dir}"]), strict=False)
    assert "warning" not in capsys.readouterr().err


def test_saved_activation_formula_matches_autograd(tiny_model_dir):
    """The per-layer formula against what autograd really saves in ctxext's training forward (nf4, LoRA, SDPA)."""
    import torch

    from ctxext.planner.footprint import layer_bytes
    from ctxext.training.model import build_training_model
    from ctxext.training.run import CausalLMWithChunkedLoss, shifted_labels

    length = 512
    recipe = load_recipe(
        "recipes/tiny-cpu.yaml",
        [f"model.path={tiny_model_dir}", f"train.seq_len={length}", "train.gradient_checkpointing=false"],
    )
    loaded = build_training_model(recipe)
    model = CausalLMWithChunkedLoss(loaded.model, recipe.train.loss_chunk_size).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(3, 500, (1, length), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, shifted_labels(ids))
    measured = sum(saved.values())
    shape = ModelShape.from_config(loaded.model.get_base_model().config)
    setup = Setup(seq_len=length, compute_bytes=4, lora_r=recipe.lora.r, checkpointing=False)
    predicted = shape.layers * layer_bytes(shape, setup)
    assert 0.75 < predicted / measured < 1.25, (predicted, measured)


def test_the_adaptive_stops_probe_is_counted():
    # Off by default: no note. On: its forward at the probe length, without gradients (one 32k sequence per pass:
    # residual, q / output, k / v, the MLP's three tensors), beside the step's, and its share of the compute.
    assert not any("train.probe" in n for n in _plan().notes)
    plan = _plan(overrides=["train.probe.interval=100", "train.probe.trials=64", "train.probe.keys=4"])
    note = next(n for n in plan.notes if n.startswith("train.probe:"))
    shape, length = plan.shape, 32768
    per_token = 4 * shape.hidden + 2 * shape.kv_heads * shape.head_dim + 3 * shape.intermediate
    assert f"~{length * per_token * plan.setup.compute_bytes / GIB:.2f} GiB of activations" in note
    assert note.startswith("train.probe: 16 forward passes at 32768 tokens without gradients every 100 steps")
    share = float(re.search(r"~([\d.]+)% of the run's compute", note).group(1))
    assert 0 < share < 15
    # The in-window check of the key forms (forms: window, the default): 32 passes per training form, once, at the
    # base's own window (Llama 2: 4,096 tokens); none with forms: trained.
    forms = len(load_recipe(LLAMA2, []).probe_forms())
    assert note.endswith(
        f"once before the first step, at most {32 * forms} at the base's 4096-token window (its key forms)"
    )
    plan = _plan(overrides=["train.probe.interval=100", "train.probe.forms=trained"])
    assert next(n for n in plan.notes if n.startswith("train.probe:")).endswith("of the run's compute")


def test_on_a_cpu_a_split_is_offered_over_processes_and_never_as_ring_attention(tiny_model_dir):
    # Ring attention (context parallelism) runs on CUDA only; Ulysses runs over gloo, one process each.
    big = [f"model.path={tiny_model_dir}", "rope.target_length=131072", "train.seq_len=131072"]
    plan = _plan("recipes/tiny-cpu.yaml", big, device=Device("small CPU", int(1.5 * GIB), None, "cpu"), search=False)
    splits = [a for a in plan.advice if "parallelism" in a.summary]
    assert not plan.fits and splits
    assert all("processes" in a.summary and "GPUs" not in a.summary + a.launch for a in splits)
    assert not any("context parallelism" in a.summary for a in splits)
