"""The lora section's `all-linear` and `embeddings` resolve to each architecture's own module names, so the default
recipe fits Llama and GPT-NeoX alike (before, its Llama names were refused on NeoX)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, GPTNeoXConfig, LlamaConfig

from ctxext.recipe.refusals import lora_module_problems, resolve_lora_names
from ctxext.recipe.sections import LoraSection
from ctxext.training.folder import adapter_targets
from ctxext.training.model import add_lora

LLAMA = LlamaConfig(
    vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=1, tie_word_embeddings=True,
)  # fmt: skip
NEOX = GPTNeoXConfig(
    vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, rotary_pct=0.5
)


def _meta(config):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_defaults_resolve_to_each_architectures_names():
    lora = LoraSection()
    llama = resolve_lora_names(_meta(LLAMA), lora.target_modules, lora.extra_trainable)
    assert llama == (["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
                     ["embed_tokens", "norm"])  # fmt: skip
    neox = resolve_lora_names(_meta(NEOX), lora.target_modules, lora.extra_trainable)
    # The output head (NeoX's embed_out, Llama's tied lm_head) never gets an adapter.
    assert neox == (["dense", "dense_4h_to_h", "dense_h_to_4h", "query_key_value"], ["embed_in", "norm"])
    assert lora_module_problems(_meta(NEOX), lora) == [] and lora_module_problems(_meta(LLAMA), lora) == []


def test_explicit_names_are_kept_and_llama_names_on_neox_still_refused():
    assert resolve_lora_names(_meta(LLAMA), ["q_proj", "all-linear"], ["norm"])[0][0] == "q_proj"
    problems = lora_module_problems(_meta(NEOX), LoraSection(target_modules=["q_proj"], extra_trainable=["norm"]))
    assert [key for key, _ in problems] == ["lora.target_modules"]
    assert "for gpt_neox set lora.target_modules=[query_key_value" in problems[0][1]


def test_the_adapter_and_its_record_use_the_resolved_names():
    model = AutoModelForCausalLM.from_config(NEOX)
    peft_model, extra = add_lora(model, LoraSection(r=2), gradient_checkpointing=False, quantized=False)
    adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in peft_model.named_parameters() if "lora_A" in n}
    assert adapted == {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}
    assert any(name.endswith("embed_in") for name in extra) and not any("embed_out" in n for n in extra)
    assert adapter_targets(peft_model, ["all-linear"]) == ["dense", "dense_4h_to_h", "dense_h_to_4h", "query_key_value"]
