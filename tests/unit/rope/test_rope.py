"""RoPE methods: runtime frequencies == ctxext's reference == independent formulas written here."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ctxext.rope.methods import METHODS
from ctxext.rope.plan import apply_plan, plan_extension
from ctxext.rope.read import read_rope
from ctxext.rope.runtime import check_model_rope, patch_model, rebuild_rotary, reset_dynamic_rope, verify_model_rope
from ctxext.rope.scaling_types import reference_rope
from ctxext.rope.types import RopeConfigError, RopeError, RopeMismatchError
from tests.helpers.tiny import tiny_config, tiny_model

D = 16  # tiny models: head_dim 64 / 4
L = 256
N = 1024
S = N / L
LONGROPE = {"short_factor": [1.0] * (D // 2), "long_factor": [1.0 + i for i in range(D // 2)]}
OPTIONS = {
    "linear": {},
    "ntk": {},
    "dynamic": {},
    "yarn": {},
    "llama3": {},
    "theta": {"rope_theta": 1e6},
    "longrope": LONGROPE,
}


def plain_inv_freq(theta: float, d: int = D) -> torch.Tensor:
    """RoPE (Su et al.): θ_i = b^(-2i/d)."""
    return torch.tensor([theta ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)


def runtime_inv_freq(model, seq_len: int) -> tuple[torch.Tensor, float]:
    module = copy.deepcopy(model.model.rotary_emb)
    module(torch.zeros(1, 1, 1), torch.tensor([[seq_len - 1]]))
    return module.inv_freq.double(), float(module.attention_scaling)


def test_registry_has_all_methods():
    assert set(METHODS) == {"linear", "ntk", "dynamic", "yarn", "llama3", "theta", "longrope"}


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("method", list(OPTIONS))
def test_runtime_equals_reference_and_forward_is_finite(kind, method):
    model = tiny_model(kind)
    plan = patch_model(model, method, N, OPTIONS[method])
    assert check_model_rope(model).ok
    state = read_rope(model.config)
    assert state.current_length == N
    assert state.original_length == L
    for seq_len in {L, N}:
        run, run_scale = runtime_inv_freq(model, seq_len)
        ref, ref_scale = reference_rope(state.parameters, D, state.max_position_embeddings, seq_len)
        torch.testing.assert_close(run, ref, rtol=1e-4, atol=0)
        assert run_scale == pytest.approx(ref_scale, rel=1e-6)
    with torch.no_grad():
        logits = model(torch.randint(0, 512, (1, N))).logits
    assert torch.isfinite(logits).all()
    assert plan.factor == pytest.approx(S)


def test_linear_is_frequencies_over_s():
    model = tiny_model()
    patch_model(model, "linear", N)
    run, scale = runtime_inv_freq(model, N)
    torch.testing.assert_close(run, plain_inv_freq(1e4) / S, rtol=1e-5, atol=0)
    assert scale == 1.0


def test_ntk_raises_base_by_s_to_d_over_d_minus_2():
    model = tiny_model()
    patch_model(model, "ntk", N)
    assert model.config.rope_parameters["rope_theta"] == pytest.approx(1e4 * S ** (D / (D - 2)))
    run, _ = runtime_inv_freq(model, N)
    torch.testing.assert_close(run, plain_inv_freq(1e4 * S ** (D / (D - 2))), rtol=1e-5, atol=0)
    # The lowest frequency is divided by exactly s (that is what the exponent d/(d-2) is for).
    assert run[-1] / plain_inv_freq(1e4)[-1] == pytest.approx(1 / S, rel=1e-4)
    assert run[0] == pytest.approx(1.0)


def test_dynamic_unchanged_up_to_original_then_scaled():
    model = tiny_model()
    patch_model(model, "dynamic", N)
    # transformers starts dynamic scaling at max_position_embeddings: it must stay at the original length.
    assert model.config.max_position_embeddings == L
    short, _ = runtime_inv_freq(model, L)
    torch.testing.assert_close(short, plain_inv_freq(1e4), rtol=1e-5, atol=0)
    long, _ = runtime_inv_freq(model, N)
    # The YaRN paper's Dynamic NTK: α = T/L at a sequence of T tokens (transformers' factor 1).
    alpha = N / L
    torch.testing.assert_close(long, plain_inv_freq(1e4 * alpha ** (D / (D - 2))), rtol=1e-4, atol=0)
    assert (long[1:] < short[1:]).all()
    mid, _ = runtime_inv_freq(model, 2 * L)
    torch.testing.assert_close(mid, plain_inv_freq(1e4 * 2.0 ** (D / (D - 2))), rtol=1e-4, atol=0)


def test_dynamic_factor_option_is_transformers_alpha():
    model = tiny_model()
    patch_model(model, "dynamic", N, {"factor": S})
    long, _ = runtime_inv_freq(model, N)
    alpha = S * N / L - (S - 1)  # s² − s + 1 at the target: 13 at 4×
    assert alpha == pytest.approx(S * S - S + 1)
    torch.testing.assert_close(long, plain_inv_freq(1e4 * alpha ** (D / (D - 2))), rtol=1e-4, atol=0)


def _rotations(inv_freq: torch.Tensor, length: int) -> torch.Tensor:
    return length * inv_freq / (2 * math.pi)


def test_yarn_keeps_high_frequencies_divides_low_and_sets_temperature():
    model = tiny_model()
    patch_model(model, "yarn", N)
    run, scale = runtime_inv_freq(model, N)
    base = plain_inv_freq(1e4)
    r = _rotations(base, L)
    fast, slow = r > 32, r < 1
    assert fast.any() and slow.any()
    torch.testing.assert_close(run[fast], base[fast], rtol=1e-5, atol=0)
    torch.testing.assert_close(run[slow], base[slow] / S, rtol=1e-5, atol=0)
    middle = ~(fast | slow)
    assert ((run[middle] <= base[middle] * (1 + 1e-6)) & (run[middle] >= base[middle] / S * (1 - 1e-6))).all()
    # YaRN §3.4: sqrt(1/t) = 0.1 ln(s) + 1 multiplies cos and sin.
    assert scale == pytest.approx(0.1 * math.log(S) + 1)


def test_llama3_keeps_high_frequencies_divides_low_smooth_between():
    model = tiny_model()
    patch_model(model, "llama3", N, {"low_freq_factor": 1.0, "high_freq_factor": 4.0})
    run, scale = runtime_inv_freq(model, N)
    base = plain_inv_freq(1e4)
    wavelength = 2 * math.pi / base
    high, low = wavelength < L / 4, wavelength > L / 1
    assert high.any() and low.any()
    torch.testing.assert_close(run[high], base[high], rtol=1e-5, atol=0)
    torch.testing.assert_close(run[low], base[low] / S, rtol=1e-5, atol=0)
    mid = ~(high | low)
    smooth = (L / wavelength[mid] - 1) / (4 - 1)
    torch.testing.assert_close(run[mid], (1 - smooth) * base[mid] / S + smooth * base[mid], rtol=1e-5, atol=0)
    assert scale == 1.0


def test_theta_sets_base():
    model = tiny_model()
    patch_model(model, "theta", N, {"rope_theta": 5e5})
    run, _ = runtime_inv_freq(model, N)
    torch.testing.assert_close(run, plain_inv_freq(5e5), rtol=1e-5, atol=0)


def test_longrope_short_within_original_long_beyond():
    model = tiny_model()
    patch_model(model, "longrope", N, LONGROPE)
    base = plain_inv_freq(1e4)
    short, scale = runtime_inv_freq(model, L)
    long, _ = runtime_inv_freq(model, N)
    torch.testing.assert_close(
        short, base / torch.tensor(LONGROPE["short_factor"], dtype=torch.float64), rtol=1e-5, atol=0
    )
    torch.testing.assert_close(
        long, base / torch.tensor(LONGROPE["long_factor"], dtype=torch.float64), rtol=1e-5, atol=0
    )
    assert scale == pytest.approx(math.sqrt(1 + math.log(S) / math.log(L)))


def test_changing_config_without_rebuild_is_caught():
    model = tiny_model()
    plan = plan_extension(model.config, "yarn", N)
    apply_plan(model.config, plan)  # config says yarn, the rotary module still computes plain RoPE
    assert not check_model_rope(model).ok
    with pytest.raises(RopeMismatchError, match="rebuild_rotary"):
        verify_model_rope(model)
    rebuild_rotary(model)
    assert verify_model_rope(model).ok


def test_reset_dynamic_rope_restores_short_state():
    model = tiny_model()
    patch_model(model, "dynamic", N)
    with torch.no_grad():
        model(torch.randint(0, 512, (1, N)))
    grown = model.model.rotary_emb.inv_freq.clone()
    reset_dynamic_rope(model)
    assert not torch.allclose(grown, model.model.rotary_emb.inv_freq)
    torch.testing.assert_close(model.model.rotary_emb.inv_freq.double(), plain_inv_freq(1e4), rtol=1e-5, atol=0)


# --- configs in all their forms ---------------------------------------------------------------


def test_legacy_config_in_standard_config_out(tmp_path):
    folder = tmp_path / "legacy"
    folder.mkdir()
    data = tiny_config().to_dict()
    data.pop("rope_parameters", None)
    data.update(
        {
            "rope_theta": 10000.0,
            "rope_scaling": {"type": "linear", "factor": 2.0},
            "max_position_embeddings": 512,
        }
    )
    (folder / "config.json").write_text(json.dumps(data))
    config = AutoConfig.from_pretrained(folder)
    state = read_rope(config)
    assert state.rope_type == "linear" and state.original_length == 256 and state.current_length == 512
    with pytest.raises(RopeError, match="already scaled: linear"):
        plan_extension(config, "yarn", 2048)
    plan = plan_extension(config, "yarn", 2048, relative_to="original")
    apply_plan(config, plan)
    out = tmp_path / "out"
    config.save_pretrained(out)
    saved = json.loads((out / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == "yarn"
    assert "type" not in saved["rope_parameters"]
    assert saved["rope_parameters"]["factor"] == 8.0
    assert saved["rope_parameters"]["original_max_position_embeddings"] == 256
    assert saved["max_position_embeddings"] == 2048


def test_rope_type_key_legacy_form():
    config = tiny_config(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    state = read_rope(config)
    assert state.rope_type == "dynamic" and state.current_length == 512 and state.original_length == 256


def test_already_extended_llama31_factor_relative_to_original():
    config = tiny_config(
        max_position_embeddings=2048,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        rope_theta=500000.0,
    )
    state = read_rope(config)
    assert (state.original_length, state.current_length, state.rope_theta) == (256, 2048, 500000.0)
    with pytest.raises(
        RopeError, match=r"(?s)already scaled: llama3 ×8.*ctxext extend --relative-to original\|current"
    ):
        plan_extension(config, "yarn", 4096)
    plan = plan_extension(config, "yarn", 4096, relative_to="original")
    assert plan.factor == 16.0
    assert plan.rope_parameters["rope_theta"] == 500000.0
    # The plan says what replacing the llama3 scaling changes: frequencies and an attention temperature.
    assert any("attention scaling goes from 1 to" in n for n in plan.notes)
    with pytest.raises(RopeError, match="cannot be stacked on llama3"):
        plan_extension(config, "yarn", 4096, relative_to="current")
    with pytest.raises(RopeError, match="not above the model's current context"):
        plan_extension(config, "yarn", 2048)


def test_codellama_style_raised_theta_is_the_base():
    config = tiny_config(rope_theta=1e6, max_position_embeddings=512)
    plan = plan_extension(config, "linear", 2048)
    assert plan.factor == 4.0 and plan.rope_parameters["rope_theta"] == 1e6


def test_target_at_or_below_current_is_an_error():
    with pytest.raises(RopeError, match="not above"):
        plan_extension(tiny_config(), "yarn", 256)
    with pytest.raises(RopeError, match="not above"):
        plan_extension(tiny_config(), "linear", 128)


def test_model_without_rope_is_a_clear_error():
    from transformers import GPT2Config

    with pytest.raises(RopeError, match="no rotary position embedding"):
        plan_extension(GPT2Config(n_layer=1, n_embd=32, n_head=2), "yarn", 4096)


def test_unknown_method_and_option():
    with pytest.raises(RopeError, match="unknown method"):
        plan_extension(tiny_config(), "magic", N)
    with pytest.raises(RopeConfigError) as info:
        plan_extension(tiny_config(), "linear", N, {"beta_fast": 16})
    assert "beta_fast" in info.value.problems


@pytest.mark.parametrize(
    ("method", "options", "field"),
    [
        ("dynamic", {"factor": 0.5}, "rope_parameters.factor"),
        ("yarn", {"beta_fast": 1.0, "beta_slow": 2.0}, "rope_parameters.beta_fast"),
        ("yarn", {"beta_fast": 2.0, "beta_slow": 2.0}, "rope_parameters.beta_fast"),
        ("llama3", {"low_freq_factor": 4.0, "high_freq_factor": 4.0}, "rope_parameters.low_freq_factor"),
        ("longrope", {"short_factor": [1.0] * 3, "long_factor": [1.0] * 8}, "rope_parameters.short_factor"),
        ("theta", {"rope_theta": 100.0}, "rope_theta"),
        ("theta", {}, "rope_theta"),
    ],
)
def test_values_transformers_only_warns_about_are_errors(method, options, field):
    with pytest.raises(RopeConfigError) as info:
        plan_extension(tiny_config(), method, N, options)
    assert field in info.value.problems, info.value.problems


def test_original_length_not_below_max_is_an_error_on_existing_configs():
    bad = tiny_config(
        max_position_embeddings=256,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    )
    with pytest.raises(RopeConfigError) as info:
        plan_extension(bad, "yarn", 4096)
    assert "rope_parameters.original_max_position_embeddings" in info.value.problems


def test_longrope_factors_file(tmp_path):
    path = tmp_path / "factors.json"
    path.write_text(json.dumps(LONGROPE))
    plan = plan_extension(tiny_config(), "longrope", N, {"factors_file": str(path)})
    assert plan.rope_parameters["long_factor"] == LONGROPE["long_factor"]
    with pytest.raises(RopeConfigError, match="does not exist"):
        plan_extension(tiny_config(), "longrope", N, {"factors_file": str(tmp_path / "none.json")})


def test_save_and_from_pretrained_round_trip(tmp_path):
    model = tiny_model()
    patch_model(model, "yarn", N, {"beta_fast": 16.0})
    with torch.no_grad():
        ids = torch.randint(0, 512, (1, 300))
        expected = model(ids).logits
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    assert verify_model_rope(loaded).ok
    assert loaded.config.rope_parameters["beta_fast"] == 16.0
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("family", "extra"),
    [
        ("gemma", {"head_dim": 16}),
        ("phi3", {"partial_rotary_factor": 0.5}),
        (
            "phi3",
            {
                "original_max_position_embeddings": 128,
                "rope_scaling": {
                    "rope_type": "longrope",
                    "short_factor": [1.0] * 8,
                    "long_factor": [2.0] * 8,
                },
            },
        ),
    ],
)
def test_other_families_partial_rotary_and_already_longrope(family, extra):
    from transformers import GemmaConfig, Phi3Config

    cls = {"gemma": GemmaConfig, "phi3": Phi3Config}[family]
    config = cls(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=1,
        **extra,
    )
    model = AutoModelForCausalLM.from_config(config).eval()
    before = read_rope(model.config)
    assert before.rotary_dim == int(16 * extra.get("partial_rotary_factor", 1.0))
    assert check_model_rope(model).ok
    plan = patch_model(model, "yarn", N, relative_to="original" if before.rope_type != "default" else None)
    assert plan.factor == N / before.original_length
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(0, 512, (1, N))).logits).all()


def test_a_snapshot_puts_the_original_rope_back_and_the_extension_again():
    # The adaptive stop checks the base's window on the extended model it trains: back and forth, exactly.
    from ctxext.rope.runtime import RopeSnapshot

    model = tiny_model()
    config = model.config
    assert not hasattr(config, "original_max_position_embeddings")
    original = RopeSnapshot(model)
    inv = [m.inv_freq.clone() for m in model.modules() if hasattr(m, "inv_freq")]
    patch_model(model, "yarn", 4 * config.max_position_embeddings)
    extended, yarn_inv = RopeSnapshot(model), [m.inv_freq.clone() for m in model.modules() if hasattr(m, "inv_freq")]
    original.apply(model)
    # A field the base did not have is gone again (not set to a stand-in object).
    assert not hasattr(config, "original_max_position_embeddings")
    assert read_rope(config).parameters.get("rope_type", "default") == "default"
    back = [m.inv_freq for m in model.modules() if hasattr(m, "inv_freq")]
    assert all(torch.equal(a, b) for a, b in zip(inv, back, strict=True))
    extended.apply(model)
    assert read_rope(config).parameters["rope_type"] == "yarn"
    now = [m.inv_freq for m in model.modules() if hasattr(m, "inv_freq")]
    assert all(torch.equal(a, b) for a, b in zip(yarn_inv, now, strict=True))
