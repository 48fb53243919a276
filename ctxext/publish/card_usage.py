"""How to load and serve an extended model: the snippets of its model card.

Loading an adapter without the repository's patched config builds the base's unscaled RoPE, and serving
engines need the RoPE settings passed explicitly: the most common ways an extension is silently lost.
"""

from __future__ import annotations

import json
from typing import Any

from ctxext.artifacts.run_record import RunRecord
from ctxext.models.refs import is_hub_id


def load_section(run: RunRecord, merged: bool, repo_id: str) -> list[str]:
    """``## How to load``: the snippet that loads the model with its scaled RoPE (the adapter needs the config).

    Args:
        run: the run's record.
        merged: a merged model rather than an adapter.
        repo_id: the repository the snippet loads.

    Returns:
        Markdown lines.
    """
    base = run.base_model
    target = run.target_length
    if merged:
        code = [
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'model = AutoModelForCausalLM.from_pretrained("{repo_id}", dtype="auto", attn_implementation="sdpa")',
            f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")',
            "# config.json carries rope_parameters; transformers >= 5 builds the scaled RoPE from it.",
            "```",
        ]
        note: list[str] = []
    else:
        code = [
            "```python",
            "from peft import PeftModel",
            "from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer",
            "",
            f"# the patched config: rope_parameters for {target} tokens",
            f'config = AutoConfig.from_pretrained("{repo_id}")',
            f'base = AutoModelForCausalLM.from_pretrained("{base}", config=config, dtype="auto", '
            'attn_implementation="sdpa")',
            f'model = PeftModel.from_pretrained(base, "{repo_id}")  # LoRA + trained embeddings/norms',
            f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")',
            "```",
        ]
        note = [
            "",
            "Pass the config from this repository: `AutoPeftModelForCausalLM.from_pretrained` (or loading the base "
            "without it) builds the base model's **unscaled** RoPE and silently degrades every input longer than "
            f"{run.original_length} tokens. `ctxext inspect` / `ctxext.verify_model_rope(model)` checks a "
            "loaded model.",
        ]
    if not merged and not is_hub_id(base):
        note += [
            "",
            f"`{base}` is not a Hub id (training used a local or built-in model): replace it with the base "
            "checkpoint's Hub id or folder.",
        ]
    return ["## How to load", "", *code, *note]


def rope_parameters(run: RunRecord, config: dict[str, Any]) -> dict[str, Any]:
    """The model's ``rope_parameters``: from its patched ``config.json``, else from ``run.json``."""
    params = config.get("rope_parameters") or run.rope_parameters
    return dict(params) if isinstance(params, dict) else {}


def serving_section(run: RunRecord, config: dict[str, Any], merged: bool, repo_id: str) -> list[str]:
    """``## Serving``: the RoPE settings for engines, vLLM commands for transformers >= 5 and older engines.

    Args:
        run: the run's record.
        config: the patched ``config.json``.
        merged: a merged model rather than an adapter.
        repo_id: the repository served.

    Returns:
        Markdown lines.
    """
    from ctxext.rope.plan import legacy_fields

    params = rope_parameters(run, config)
    target = run.target_length
    max_pos = config.get("max_position_embeddings") or target
    overrides = json.dumps({"rope_parameters": params, "max_position_embeddings": max_pos})
    lines = ["## Serving", ""]
    if not merged:
        lines += [
            "This adapter also carries fully trained embedding and norm weights, which LoRA serving does not apply: "
            "serve the merged model (`ctxext merge RUN --out DIR`, then push it with `--merged`).",
            "",
        ]
    serve_ref = repo_id if merged else "<merged model>"
    lines += [
        "The RoPE settings (`rope_parameters`), to pass to engines that do not read them from `config.json`:",
        "",
        "```json",
        json.dumps(params, indent=2),
        "```",
        "",
        "vLLM:",
        "",
        "```bash",
        f"vllm serve {serve_ref} --max-model-len {target} \\",
        f"  --hf-overrides '{overrides}'",
        "```",
    ]
    legacy = legacy_fields(params)
    legacy_overrides = json.dumps({**legacy, "max_position_embeddings": max_pos})
    lines += [
        "",
        "Engines built on transformers < 5 read `rope_scaling` / `rope_theta` instead:",
        "",
        "```bash",
        f"vllm serve {serve_ref} --max-model-len {target} \\",
        f"  --hf-overrides '{legacy_overrides}'",
        "```",
    ]
    if params.get("rope_type") in ("dynamic", "longrope"):
        lines += [
            "",
            f"Note: `{params['rope_type']}` frequencies depend on the sequence length; with a KV cache the keys "
            "of earlier tokens keep the frequencies they were computed with (transformers#25104), so cached and "
            "uncached generation can differ.",
        ]
    if max_pos != target:
        lines += ["", f"`max_position_embeddings` is {max_pos}; pass `--max-model-len {target}` explicitly."]
    return lines
