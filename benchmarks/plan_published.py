"""``ctxext plan``'s predictions for settings with published memory figures, next to those figures.

Config-only (no GPU needed): each setting is a recipe for :func:`ctxext.planner.plan.plan_recipe` with the model's
published shape. Sources and the published numbers are in the table; ``docs/planning.md`` explains each
difference. Written to ``benchmarks/results/plan_published.md``.

Usage::

    python -m benchmarks.plan_published
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "plan_published.md"
GIB = 2**30

# Published shapes (config.json values) of the models the sources used.
LLAMA_7B = dict(
    hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, vocab_size=32000
)
LLAMA_65B = dict(
    hidden_size=8192, intermediate_size=22016, num_hidden_layers=80, num_attention_heads=64, vocab_size=32000
)
LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
)
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class Case:
    """One published setting."""

    source: str
    setting: str
    published: str
    shape: dict
    recipe: dict
    gpu: str
    num_gpus: int = 1
    loss: str = "chunked"
    sharding: str | None = None
    measure: str = "total"  # "total": predicted peak GiB; "longest": longest fitting seq_len
    published_value: float = 0.0
    kwargs: dict = field(default_factory=dict)


# The train.memory levers as these setups ran: none (peft + transformers as they are; plain CUDA allocator).
LEVERS_OFF = {"residual_dtype": "auto", "offload_checkpoints": False, "tiled_mlp": False, "expandable_segments": False}
# unsloth's long-context run: bf16 residual stream, checkpoints offloaded to host memory, chunked loss; no tiled MLP.
UNSLOTH = {"residual_dtype": "bf16", "offload_checkpoints": True, "tiled_mlp": False, "expandable_segments": False}


def _recipe(seq_len: int, quant: str, r: int, extra: list[str], optimizer: str, attn: str = "sdpa", **train):
    train.setdefault("memory", LEVERS_OFF)
    if quant != "none" and train["memory"]["residual_dtype"] == "auto":
        train["memory"] = {**train["memory"], "residual_dtype": "fp32"}  # peft's k-bit upcast
    return {
        "model": {"path": "published", "attn_implementation": attn},
        "rope": {"method": "none"},
        "quantization": {"mode": quant},
        "lora": {"r": r, "alpha": 2 * r, "target_modules": ALL_LINEAR, "extra_trainable": extra},
        "data": {"path": "unused"},
        "train": {"seq_len": seq_len, "optimizer": optimizer, "gradient_checkpointing": True, **train},
    }


CASES = [
    Case(
        "QLoRA (Dettmers et al. 2023), §1 and Fig. 6",
        "LLaMA-65B, nf4 + double quant, LoRA r=64 on all linear layers, 512 tokens, batch 1, checkpointing; "
        "AdamW (the paper's is paged: its states can move to CPU RAM; planned on the GPU)",
        "fits one 48 GB GPU",
        LLAMA_65B,
        _recipe(512, "nf4", 64, [], "adamw"),
        "l40s",
        published_value=48e9 / GIB,
    ),
    Case(
        "QLoRA (Dettmers et al. 2023), Fig. 6",
        "LLaMA-7B, same setting",
        "~5–6 GB",
        LLAMA_7B,
        _recipe(512, "nf4", 64, [], "adamw"),
        "a100-80gb",
        published_value=5.5e9 / GIB,
    ),
    Case(
        "LongLoRA (Chen et al. 2024), Table 12",
        "Llama 2 7B, LoRA (standard attention, FlashAttention-2), bf16 base, 8,192 tokens, 8×A100",
        "25.7 GB peak",
        LLAMA_7B,
        _recipe(8192, "none", 8, [], "adamw", attn="flash_attention_2"),
        "a100-80gb",
        num_gpus=8,
        loss="full",
        published_value=25.7e9 / GIB,
    ),
    Case(
        "LongLoRA (Chen et al. 2024), Table 12",
        "same, 65,536 tokens",
        "71.1 GB peak",
        LLAMA_7B,
        _recipe(65536, "none", 8, [], "adamw", attn="flash_attention_2"),
        "a100-80gb",
        num_gpus=8,
        loss="full",
        published_value=71.1e9 / GIB,
    ),
    Case(
        "unsloth README (long-context table)",
        "Llama 3.1 8B QLoRA on 80 GB, Hugging Face + FlashAttention-2 (full logits, checkpointing)",
        "28,454 tokens max",
        LLAMA3_8B,
        _recipe(8192, "nf4", 32, [], "paged_adamw_8bit", attn="flash_attention_2"),
        "h100-80gb",
        loss="full",
        measure="longest",
        published_value=28454,
    ),
    Case(
        "unsloth README (long-context table)",
        "same model with unsloth (chunked loss, checkpoints offloaded to CPU RAM, bf16 residual stream); here: the "
        "same levers of ctxext's train.memory (tiled MLP off)",
        "342,733 tokens max",
        LLAMA3_8B,
        _recipe(8192, "nf4", 32, [], "paged_adamw_8bit", attn="flash_attention_2", memory=UNSLOTH),
        "h100-80gb",
        measure="longest",
        published_value=342733,
    ),
    Case(
        "EasyContext (Zhang, 2024) README",
        "Llama 2 7B, 8×A100 80 GB, ring attention over 8 GPUs; here: bf16 base + LoRA, FSDP2, context parallel 8",
        "700,000 tokens",
        LLAMA_7B,
        _recipe(8192, "none", 8, [], "adamw", attn="flash_attention_2", context_parallel_size=8),
        "a100-80gb",
        num_gpus=8,
        measure="longest",
        published_value=700000,
    ),
]


def predict(case: Case):
    """The plan of one case."""
    from transformers import LlamaConfig

    from ctxext.models.devices import gpu
    from ctxext.planner.plan import plan_recipe
    from ctxext.recipe.schema import parse_recipe

    recipe = parse_recipe(case.recipe, source=case.setting)
    config = LlamaConfig(**case.shape, tie_word_embeddings=False)
    return plan_recipe(
        recipe,
        gpu(case.gpu),
        num_gpus=case.num_gpus,
        loss=case.loss,
        sharding=case.sharding,
        config=config,
        config_source="published shape",
        advise_changes=False,
    )


def main(argv: list[str] | None = None) -> None:
    """Plan every case and write the table."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true", help=f"print the table; do not write {RESULTS.name}")
    args = parser.parse_args(argv)
    from benchmarks._common import measured_on

    rows = [
        "| source | setting | published | planned | difference |",
        "| --- | --- | --- | --- | ---: |",
    ]
    for case in CASES:
        plan = predict(case)
        if case.measure == "longest":
            value = plan.longest or 0
            planned = f"{value:,} tokens longest on {case.num_gpus}× {case.gpu}"
        else:
            value = plan.memory.total / GIB
            planned = (
                f"{value:.1f} GiB ({value * GIB / 1e9:.1f} GB) per GPU, peak in the {plan.memory.peak_phase} phase"
            )
        diff = value / case.published_value - 1
        rows.append(f"| {case.source} | {case.setting} | {case.published} | {planned} | {diff:+.0%} |")
        print(rows[-1], flush=True)
    text = (
        "# `ctxext plan` vs. published memory figures\n\n"
        "Command: `python -m benchmarks.plan_published` (config-only; no GPU). The difference is planned / "
        "published − 1 (memory: GB = 10⁹ bytes as the sources print it; lengths: tokens). Each difference is "
        f"discussed in `docs/planning.md`.\n\n{measured_on()}\n\n" + "\n".join(rows) + "\n"
    )
    if args.no_write:
        return
    RESULTS.write_text(text)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
